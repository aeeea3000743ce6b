//! The state Redis last reported for each key, kept under `on_error: local` so that the in-process fallback starts
//! each key from what Redis had admitted in its window, not from empty.

use std::hash::{BuildHasher, RandomState};

use indexmap::IndexMap;
use parking_lot::Mutex;

use super::store::memory_keys::{KeyRef, StoredHash, StoredKey, SHARDS};
use super::store::LimitCheck;
use super::Outcome;

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
#[derive(Debug)]
pub(super) struct LastReported {
    shards: Box<[Mutex<Reports>]>,
    hasher: RandomState,
}

// === impl LastReported ===

impl Default for LastReported {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl LastReported {
    /// Remembers what Redis's `outcome` for `checks` says of each key at `now_ms`. A key that is back to full is
    /// forgotten; slots and shadow limits are not the fallback's to seed.
    pub(super) fn remember(&self, checks: &[LimitCheck<'_>], outcome: &Outcome, now_ms: i64) {
        for (check, decision) in checks.iter().zip(&outcome.decisions) {
            let limit = check.limit;
            if limit.is_shadow() || limit.algorithm().holds_slots() {
                continue;
            }
            let taken = decision.limit.saturating_sub(decision.remaining);
            let key = self.key_ref(check.key);
            let mut shard = self.shards[key.shard()].lock();
            if taken == 0 || decision.reset_after_ms == 0 {
                shard.swap_remove(&key);
                continue;
            }
            let report = Report {
                taken,
                at_ms: now_ms,
                until_ms: now_ms.saturating_add(decision.reset_after_ms as i64),
            };
            // Found in place, a key known already costs no allocation.
            if let Some(held) = shard.get_mut(&key) {
                *held = report;
                continue;
            }
            if shard.len() >= MAX_KEYS / SHARDS {
                shard.retain(|_, held| held.until_ms > now_ms);
                if shard.len() >= MAX_KEYS / SHARDS {
                    continue;
                }
            }
            let stored = StoredKey {
                hash: key.hash,
                text: check.key.into(),
            };
            shard.insert(stored, report);
        }
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
    use crate::{Algorithm, Decision, Limit};

    #[test]
    fn the_last_report_is_taken_once_and_only_while_it_says_something() {
        let limit = Limit::new(
            "log",
            Algorithm::SlidingLog {
                limit: 50,
                period_ms: 10_000,
            },
            1,
        )
        .expect("valid");
        let checks = [LimitCheck {
            key: "k",
            limit: &limit,
        }];
        let decided = |remaining, reset_after_ms| Outcome {
            allowed: true,
            decisions: vec![Decision {
                allowed: true,
                limit: 50,
                remaining,
                retry_after_ms: 0,
                reset_after_ms,
                delay_ms: 0,
                owed: 0,
            }],
            batch: 0,
        };
        let reported = LastReported::default();
        reported.remember(&checks, &decided(10, 10_000), 1_000);
        reported.remember(&checks, &decided(5, 10_000), 2_000);
        let report = Report {
            taken: 45,
            at_ms: 2_000,
            until_ms: 12_000,
        };
        assert_eq!(reported.take("k", 3_000), Some(report));
        assert_eq!(reported.take("k", 3_000), None);
        reported.remember(&checks, &decided(5, 10_000), 2_000);
        assert_eq!(reported.take("k", 12_000), None, "back to full by then");
        reported.remember(&checks, &decided(5, 10_000), 2_000);
        reported.remember(&checks, &decided(50, 0), 2_500);
        assert_eq!(reported.take("k", 3_000), None, "full again");
    }
}
