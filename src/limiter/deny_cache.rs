//! The over-limit cache: a key the store denied until time T is answered in-process until T, so a flood on one
//! key costs Redis nothing. Exact, because nothing can make a denied key admit sooner than its `retry_after`:
//! denied requests consume nothing, and the same limit always asks the same cost. What can (a reload, a plan
//! change or an override that raises the limit) changes the parameters, and a denial belongs to the parameters it
//! was computed with: asked with others, the cache does not answer. A give-back (a reservation settled for less)
//! can too: this instance forgets the key's denial when it gives back; another instance's cache errs on the side
//! of refusing until the denial's `retry_after`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Algorithm, Decision, Limit};

/// Entries kept at most; beyond it expired entries are dropped, then the cache is cleared (it is only an
/// optimisation: an empty cache asks Redis, which is always right).
const MAX_ENTRIES: usize = 100_000;

/// Denied keys and until when.
#[derive(Debug, Default)]
pub struct DenyCache {
    entries: Mutex<HashMap<Box<str>, Denial>>,
}

#[derive(Debug, Clone, Copy)]
struct Denial {
    decision: Decision,
    at: Instant,
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
    /// Remembers that `key` was denied with `decision` at `at`, under `limit`'s parameters.
    pub fn remember(&self, key: &str, limit: &Limit, decision: Decision, at: Instant) {
        if decision.allowed || decision.retry_after_ms == 0 {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, d| d.until() > at);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        let params = Params::of(limit);
        entries.insert(
            key.into(),
            Denial {
                decision,
                at,
                params,
            },
        );
    }

    /// The denials of `checks` (each a key and the limit it is asked under) that still hold at `now`, in order,
    /// or `None` when none does: asked for every request, so one lock for all the keys, no hashing while nothing
    /// is denied, and nothing allocated on a miss. A denial computed under other parameters than the limit's now
    /// does not hold.
    pub fn lookup_each<'k>(
        &self,
        checks: impl ExactSizeIterator<Item = (&'k str, &'k Limit)>,
        now: Instant,
    ) -> Option<Vec<Option<Decision>>> {
        let entries = self.entries.lock();
        if entries.is_empty() {
            return None;
        }
        let count = checks.len();
        let mut held: Option<Vec<Option<Decision>>> = None;
        for (i, (key, limit)) in checks.enumerate() {
            let holding = entries
                .get(key)
                .filter(|denial| denial.params == Params::of(limit));
            if let Some(decision) = holding.and_then(|denial| denial.as_of(now)) {
                held.get_or_insert_with(|| vec![None; count])[i] = Some(decision);
            }
        }
        held
    }

    /// Forgets the denial of `key`, if any (after an admin reset, here or on another instance).
    pub fn forget(&self, key: &str) {
        self.entries.lock().remove(key);
    }

    /// Forgets every denial (when resets elsewhere may have gone unheard: the cache only spares Redis work, and
    /// an empty one asks Redis, which is always right).
    pub fn clear(&self) {
        self.entries.lock().clear();
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
    fn until(&self) -> Instant {
        self.at + Duration::from_millis(self.decision.retry_after_ms)
    }

    /// The decision as it stands at `now`, if the denial still holds.
    fn as_of(&self, now: Instant) -> Option<Decision> {
        if self.until() <= now {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.at).as_millis() as u64;
        let d = self.decision;
        Some(Decision {
            retry_after_ms: d.retry_after_ms.saturating_sub(elapsed).max(1),
            reset_after_ms: d.reset_after_ms.saturating_sub(elapsed),
            ..d
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(retry_after_ms: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 5,
            remaining: 0,
            retry_after_ms,
            reset_after_ms: retry_after_ms + 1_000,
            delay_ms: 0,
        }
    }

    fn log_limit(limit: u64) -> Limit {
        Limit::new(
            "per-ip",
            Algorithm::SlidingLog {
                limit,
                period_ms: 60_000,
            },
            1,
        )
        .expect("limit")
    }

    #[test]
    fn denial_holds_until_retry_after_then_expires() {
        let cache = DenyCache::default();
        let limit = log_limit(5);
        let t0 = Instant::now();
        assert_eq!(cache.lookup_each([("k", &limit)].into_iter(), t0), None);
        cache.remember("k", &limit, denied(2_000), t0);
        let held = cache
            .lookup_each(
                [("other", &limit), ("k", &limit)].into_iter(),
                t0 + Duration::from_millis(500),
            )
            .expect("still denied");
        assert_eq!(held[0], None);
        let k = held[1].expect("k is denied");
        assert_eq!((k.retry_after_ms, k.reset_after_ms), (1_500, 2_500));
        assert_eq!(
            cache.lookup_each(
                [("k", &limit)].into_iter(),
                t0 + Duration::from_millis(2_000)
            ),
            None
        );
        assert_eq!(cache.lookup_each([("other", &limit)].into_iter(), t0), None);
    }

    #[test]
    fn a_denial_does_not_hold_under_other_parameters() {
        let cache = DenyCache::default();
        let (old, raised) = (log_limit(5), log_limit(8));
        let t0 = Instant::now();
        cache.remember("k", &old, denied(60_000), t0);
        assert_eq!(cache.lookup_each([("k", &raised)].into_iter(), t0), None);
        let costlier = Limit::new("per-ip", *old.algorithm(), 2).expect("limit");
        assert_eq!(cache.lookup_each([("k", &costlier)].into_iter(), t0), None);
        // Back to the parameters it was computed with, it holds again.
        assert!(cache.lookup_each([("k", &old)].into_iter(), t0).is_some());
    }
}
