//! What a directory that holds only some consumers remembers besides them: which were cached in what order (to
//! keep the most recently used, `consumers.cache`), and the keys and consumers Redis said it has no record of, for a
//! few seconds, so that a flood of wrong keys asks Redis once per key rather than once per request.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;

use super::tables::Tables;

/// How long a key or consumer Redis has no record of is taken as absent without asking again. A change to it is
/// announced and forgets it at once; this bounds what a missed announcement can hold back.
const ABSENT_FOR: Duration = Duration::from_secs(5);
#[cfg(feature = "redis")]
/// How many absent keys and consumers are remembered at most (a flood of distinct wrong keys then costs lookups,
/// never memory).
const ABSENT_BOUND: usize = 100_000;

/// The order consumers entered a bounded cache in: a CLOCK over them, evicting the first not used since it was
/// last passed over.
// Only a directory in Redis is a cache.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug)]
pub(super) struct Recency {
    capacity: usize,
    clock: parking_lot::Mutex<VecDeque<Arc<str>>>,
}

/// Keys and consumers Redis has no record of, with when it said so.
#[derive(Debug, Default)]
pub(super) struct Absent {
    keys: HashMap<[u8; 32], Instant, RandomState>,
    consumers: HashMap<Arc<str>, Instant, RandomState>,
}

// === impl Recency ===

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Recency {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            clock: parking_lot::Mutex::default(),
        }
    }

    /// How many consumers the cache holds at most.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Notes `id` as just put into `tables`, then evicts until they hold at most the capacity.
    pub(super) fn admitted(&self, id: &str, tables: &Tables) {
        let mut clock = self.clock.lock();
        clock.push_back(Arc::from(id));
        // Each consumer is passed over at most twice (its used mark cleared the first time).
        let mut turns = 2 * clock.len();
        while tables.len() > self.capacity && turns > 0 {
            turns -= 1;
            let Some(oldest) = clock.pop_front() else {
                break;
            };
            if !tables.evict_unless_used(&oldest) {
                clock.push_back(oldest);
            }
        }
        // Ids already gone (deleted, or evicted by a flush) leave the clock as it passes them.
        if clock.len() > 2 * self.capacity {
            clock.retain(|id| tables.holds(id));
        }
    }

    /// Forgets every consumer (the cache was emptied).
    pub(super) fn clear(&self) {
        self.clock.lock().clear();
    }
}

// === impl Absent ===

impl Absent {
    /// Whether Redis said lately that no consumer holds the key whose SHA-256 is `digest`.
    pub(super) fn key(&self, digest: &[u8; 32]) -> bool {
        self.keys.get(digest).is_some_and(fresh)
    }

    /// Whether Redis said lately that consumer `id` has no record.
    pub(super) fn consumer(&self, id: &str) -> bool {
        self.consumers.get(id).is_some_and(fresh)
    }

    #[cfg(feature = "redis")]
    pub(super) fn remember_key(&mut self, digest: [u8; 32]) {
        if self.keys.len() >= ABSENT_BOUND {
            self.keys.retain(|_, when| fresh(when));
            if self.keys.len() >= ABSENT_BOUND {
                self.keys.clear();
            }
        }
        self.keys.insert(digest, Instant::now());
    }

    #[cfg(feature = "redis")]
    pub(super) fn remember_consumer(&mut self, id: &str) {
        if self.consumers.len() >= ABSENT_BOUND {
            self.consumers.retain(|_, when| fresh(when));
            if self.consumers.len() >= ABSENT_BOUND {
                self.consumers.clear();
            }
        }
        self.consumers.insert(Arc::from(id), Instant::now());
    }

    /// Forgets what was remembered of consumer `id` and of the keys `digests` (a change to them was announced).
    #[cfg(feature = "redis")]
    pub(super) fn forget(&mut self, id: &str, digests: impl Iterator<Item = [u8; 32]>) {
        self.consumers.remove(id);
        for digest in digests {
            self.keys.remove(&digest);
        }
    }
}

fn fresh(when: &Instant) -> bool {
    when.elapsed() < ABSENT_FOR
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::directory::record::ConsumerRecord;

    #[test]
    fn the_cache_keeps_the_consumers_used_since_they_were_last_passed_over() {
        let tables = Tables::default();
        let recency = Recency::new(3);
        let record = ConsumerRecord::default();
        for id in ["a", "b", "c"] {
            tables.set(id, Some(&record));
            recency.admitted(id, &tables);
        }
        // Entering counts as a use. `d` comes in: all were used, so each loses its mark once and `a`, the oldest,
        // goes; `d` itself stays.
        tables.set("d", Some(&record));
        recency.admitted("d", &tables);
        assert_eq!(tables.len(), 3);
        assert!(!tables.holds("a"));
        assert!(tables.holds("d"));
        // `c` is used again; `e` comes in: `b`, not used since it was passed over, goes; `c` stays.
        assert!(tables.consumer("c").is_some());
        tables.set("e", Some(&record));
        recency.admitted("e", &tables);
        assert!(!tables.holds("b"));
        assert!(tables.holds("c") && tables.holds("d") && tables.holds("e"));
    }

    #[test]
    fn absent_keys_are_remembered_briefly_and_forgotten_on_a_change() {
        let mut absent = Absent::default();
        absent.remember_key([7; 32]);
        absent.remember_consumer("acme");
        assert!(absent.key(&[7; 32]) && absent.consumer("acme"));
        assert!(!absent.key(&[8; 32]) && !absent.consumer("globex"));
        absent.forget("acme", [[7; 32]].into_iter());
        assert!(!absent.key(&[7; 32]) && !absent.consumer("acme"));
        let old = Instant::now().checked_sub(ABSENT_FOR);
        if let Some(old) = old {
            absent.keys.insert([9; 32], old);
            assert!(!absent.key(&[9; 32]), "remembered past its time");
        }
    }
}
