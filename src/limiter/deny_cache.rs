//! The over-limit cache: a key the store denied until time T is answered in-process until T, so a flood on one
//! key costs Redis nothing. Exact, because nothing can make a denied key admit sooner than its `retry_after`:
//! denied requests consume nothing, and the same limit always asks the same cost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::Decision;

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
}

impl DenyCache {
    /// Remembers that `key` was denied with `decision` at `at`.
    pub fn remember(&self, key: &str, decision: Decision, at: Instant) {
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
        entries.insert(key.into(), Denial { decision, at });
    }

    /// The denials of `keys` that still hold at `now`, in order, or `None` when none does: asked for every
    /// request, so one lock for all the keys, no hashing while nothing is denied, and nothing allocated on a
    /// miss.
    pub fn lookup_each<'k>(
        &self,
        keys: impl ExactSizeIterator<Item = &'k str>,
        now: Instant,
    ) -> Option<Vec<Option<Decision>>> {
        let entries = self.entries.lock();
        if entries.is_empty() {
            return None;
        }
        let count = keys.len();
        let mut held: Option<Vec<Option<Decision>>> = None;
        for (i, key) in keys.enumerate() {
            if let Some(decision) = entries.get(key).and_then(|denial| denial.as_of(now)) {
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

    #[test]
    fn denial_holds_until_retry_after_then_expires() {
        let cache = DenyCache::default();
        let t0 = Instant::now();
        assert_eq!(cache.lookup_each(["k"].into_iter(), t0), None);
        cache.remember("k", denied(2_000), t0);
        let held = cache
            .lookup_each(["other", "k"].into_iter(), t0 + Duration::from_millis(500))
            .expect("still denied");
        assert_eq!(held[0], None);
        let k = held[1].expect("k is denied");
        assert_eq!((k.retry_after_ms, k.reset_after_ms), (1_500, 2_500));
        assert_eq!(
            cache.lookup_each(["k"].into_iter(), t0 + Duration::from_millis(2_000)),
            None
        );
        assert_eq!(cache.lookup_each(["other"].into_iter(), t0), None);
    }
}
