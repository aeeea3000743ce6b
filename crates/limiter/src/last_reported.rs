//! The state Redis last reported for each key, kept under `on_error: local` so that the in-process fallback starts
//! each key from what Redis had admitted in its window, not from empty.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use indexmap::IndexMap;
use parking_lot::Mutex;

use super::clock::Clock;
use super::store::memory_keys::{KeyRef, StoredHash, StoredKey, SHARDS};
use super::Decision;

/// Keys remembered at most: past it, a new key's report is dropped (its fallback starts from empty, as without
/// this), so memory stays bounded whatever the number of keys Redis decides.
const MAX_KEYS: usize = 100_000;

/// What one reply said of one key: only what the reply already carries, so remembering it costs no Redis call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Report {
    /// The capacity less what remained: a window's count, a bucket's spent tokens.
    pub(super) taken: u64,
    /// When the reply came back, on the fallback's clock (ms).
    pub(super) at_ms: i64,
    /// When the key is back to full capacity: past it the report says nothing.
    pub(super) until_ms: i64,
}

/// One shard's reports, by store key: a key is hashed once (SipHash, keyed per process, as the in-process store
/// hashes its keys: clients choose them), and that hash picks the shard and finds the entry.
type Reports = IndexMap<StoredKey, Report, StoredHash>;

/// The last [`Report`] of each key Redis decided, sharded so that concurrent requests rarely share a lock.
///
/// The Redis store tells it what each call decided (see `RedisStore::report_to`), once per run of identical
/// requests (the run's last decision says the state its keys were left in), rather than each request telling it
/// its own: a hot key's requests then pay one look-up for a whole call.
pub(crate) struct LastReported {
    shards: Box<[Mutex<Reports>]>,
    hasher: RandomState,
    /// The fallback's clock, which reports are stamped with.
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for LastReported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LastReported").finish_non_exhaustive()
    }
}

// === impl LastReported ===

impl LastReported {
    /// Reports stamped with `clock`'s time: the fallback's, which they seed.
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            clock,
        }
    }

    /// The time reports are stamped with now.
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Remembers what Redis's `decision` says of `key` at `now_ms`: a key back to full is forgotten. The caller
    /// leaves out the keys the fallback is not to seed (a shadow limit's, slots).
    pub(crate) fn remember(&self, key: &str, decision: &Decision, now_ms: i64) {
        let taken = decision.limit.saturating_sub(decision.remaining);
        let found = self.key_ref(key);
        let mut shard = self.shards[found.shard()].lock();
        if taken == 0 || decision.reset_after_ms == 0 {
            shard.swap_remove(&found);
            return;
        }
        let report = Report {
            taken,
            at_ms: now_ms,
            until_ms: now_ms.saturating_add(decision.reset_after_ms as i64),
        };
        // Found in place, a key known already costs no allocation.
        if let Some(held) = shard.get_mut(&found) {
            *held = report;
            return;
        }
        if shard.len() >= MAX_KEYS / SHARDS {
            shard.retain(|_, held| held.until_ms > now_ms);
            if shard.len() >= MAX_KEYS / SHARDS {
                return;
            }
        }
        let stored = StoredKey {
            hash: found.hash,
            text: key.into(),
        };
        shard.insert(stored, report);
    }

    /// The last report of `key`, if it still says something at `now_ms`, forgotten once taken: the fallback
    /// starts the key from it once per outage.
    pub(super) fn take(&self, key: &str, now_ms: i64) -> Option<Report> {
        let key = self.key_ref(key);
        self.shards[key.shard()]
            .lock()
            .swap_remove(&key)
            .filter(|report| report.until_ms > now_ms)
    }

    fn key_ref<'k>(&self, key: &'k str) -> KeyRef<'k> {
        KeyRef {
            hash: self.hasher.hash_one(key),
            text: key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_report_is_taken_once_and_only_while_it_says_something() {
        let decided = |remaining, reset_after_ms| Decision {
            allowed: true,
            limit: 50,
            remaining,
            retry_after_ms: 0,
            reset_after_ms,
            delay_ms: 0,
            owed: 0,
        };
        let reported = LastReported::new(Arc::new(crate::clock::SystemClock));
        reported.remember("k", &decided(10, 10_000), 1_000);
        reported.remember("k", &decided(5, 10_000), 2_000);
        let report = Report {
            taken: 45,
            at_ms: 2_000,
            until_ms: 12_000,
        };
        assert_eq!(reported.take("k", 3_000), Some(report));
        assert_eq!(reported.take("k", 3_000), None);
        reported.remember("k", &decided(5, 10_000), 2_000);
        assert_eq!(reported.take("k", 12_000), None, "back to full by then");
        reported.remember("k", &decided(5, 10_000), 2_000);
        reported.remember("k", &decided(50, 0), 2_500);
        assert_eq!(reported.take("k", 3_000), None, "full again");
    }
}
