//! One shard of the in-process store: its entries, and how a full shard makes room for a new key.

use std::collections::HashMap;

use indexmap::{Equivalent, IndexMap};
use smallvec::SmallVec;

use super::keys::{KeyRef, StoredHash, StoredKey};
use crate::algorithms::State;

/// Entries a full shard looks at to make room for a new key: the next ones under its clock hand, so that a sweep
/// costs the same whatever the shard's size and, over successive new keys, looks at every entry.
const EVICTION_SAMPLE: usize = 16;

#[derive(Debug, Default)]
pub(super) struct Shard {
    /// Hashed by the hash stored with each key (see [`StoredKey`]).
    pub(super) entries: IndexMap<StoredKey, Entry, StoredHash>,
    /// Where the next search for room starts (a clock hand).
    hand: usize,
    /// How many keys each limit holds here, by the key's text before its `{` (`<prefix><route>:<limit>:`).
    pub(super) per_limit: HashMap<Box<str>, usize>,
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) state: State,
    /// When the key is back to full capacity: from then on, holding it or not gives the same decisions.
    pub(super) expires_at_ms: i64,
    /// When a request last looked the key up, for displacing the least recently used.
    pub(super) used_ms: i64,
    /// The last commit left less than one request's cost: the key refuses requests until its retry time. The
    /// retry time is not kept, so such a key is held until it is back to full, which is never earlier.
    pub(super) over_limit: bool,
}

/// A full shard found no key it may displace; the earliest time one of the keys it looked at will be.
#[derive(Debug, Clone, Copy)]
pub(super) struct NoRoom {
    pub(super) until_ms: i64,
}

/// Entries looked at for room in one limit's share of a shard: more than [`EVICTION_SAMPLE`], since only the
/// limit's own count (a quarter of the shard, by default, when it is at its bound).
const LIMIT_SAMPLE: usize = 64;

/// The limit a store key belongs to: its text before the `{` of its value (`<prefix><route>:<limit>:`).
pub(super) fn limit_of(key: &str) -> &str {
    key.find('{').map_or(key, |at| &key[..at])
}

/// Counts one key of `key`'s limit fewer.
pub(super) fn forget_one(per_limit: &mut HashMap<Box<str>, usize>, key: &str) {
    let limit = limit_of(key);
    if let Some(count) = per_limit.get_mut(limit) {
        *count -= 1;
        if *count == 0 {
            per_limit.remove(limit);
        }
    }
}

// === impl Shard ===

impl Shard {
    /// Stores `entry` for `key`, which the same request found at `found` (unless another of its keys made room
    /// since, which may have moved it).
    pub(super) fn store(
        &mut self,
        key: KeyRef<'_>,
        found: Option<usize>,
        entry: Entry,
        now_ms: i64,
        max_entries: usize,
    ) {
        let at = found
            .filter(|&index| {
                self.entries
                    .get_index(index)
                    .is_some_and(|(held, _)| key.equivalent(held))
            })
            .or_else(|| self.entries.get_index_of(&key));
        if let Some(index) = at {
            self.entries[index] = entry;
            return;
        }
        // Room was made before the request committed; only a key of the same request displaced since (and now
        // stored again) may find the shard full, and goes over the bound by one rather than lose its count.
        if self.entries.len() >= max_entries {
            let _ = self.make_room(now_ms);
        }
        let limit = limit_of(key.text);
        match self.per_limit.get_mut(limit) {
            Some(count) => *count += 1,
            None => {
                self.per_limit.insert(limit.into(), 1);
            }
        }
        let key = StoredKey {
            hash: key.hash,
            text: key.text.into(),
        };
        self.entries.insert(key, entry);
    }

    /// Removes the entry at `index`, keeping the count of its limit.
    pub(super) fn remove_index(&mut self, index: usize) -> Option<Entry> {
        let (key, entry) = self.entries.swap_remove_index(index)?;
        forget_one(&mut self.per_limit, &key.text);
        Some(entry)
    }

    /// Makes room in `limit`'s share of the shard for one new key of it besides `pending` others: displaces its
    /// own keys (back to full first, else the least recently used not over its limit) among the entries under the
    /// clock hand, or says when one of them may next be displaced. Other limits' keys are never touched.
    pub(super) fn make_room_in_limit(
        &mut self,
        limit: &str,
        pending: usize,
        now_ms: i64,
        max_in_limit: usize,
    ) -> Result<(), NoRoom> {
        while self.per_limit.get(limit).copied().unwrap_or(0) + pending >= max_in_limit {
            let len = self.entries.len();
            let start = self.hand % len.max(1);
            let looked = LIMIT_SAMPLE.min(len);
            let mut sample = Sample::new();
            for step in 0..looked {
                let index = (start + step) % len;
                let (key, entry) = self.entries.get_index(index).expect("index below len");
                if limit_of(&key.text) == limit {
                    sample.consider(index, entry, now_ms);
                }
            }
            self.hand = start + looked;
            let index = sample
                .full
                .first()
                .copied()
                .or(sample.least_recent.map(|(index, _)| index))
                .ok_or(NoRoom {
                    until_ms: if sample.until_ms == i64::MAX {
                        now_ms + 1000
                    } else {
                        sample.until_ms
                    },
                })?;
            self.remove_index(index);
        }
        Ok(())
    }

    /// Makes room for one new key besides `pending` others: displaces keys until the shard holds fewer than
    /// `max_entries` with them, or says when it may next be able to.
    pub(super) fn make_room_for(
        &mut self,
        pending: usize,
        now_ms: i64,
        max_entries: usize,
    ) -> Result<(), NoRoom> {
        while self.entries.len() + pending >= max_entries {
            self.make_room(now_ms)?;
        }
        Ok(())
    }

    /// Looks at the next [`EVICTION_SAMPLE`] entries under the clock hand and removes those back to full, or
    /// else the least recently used of them that is not over its limit. A key over its limit is never removed
    /// before it is back to full.
    fn make_room(&mut self, now_ms: i64) -> Result<(), NoRoom> {
        let len = self.entries.len();
        if len == 0 {
            return Ok(());
        }
        let mut sample = Sample::new();
        let start = self.hand % len;
        let looked = EVICTION_SAMPLE.min(len);
        for step in 0..looked {
            let index = (start + step) % len;
            sample.consider(index, &self.entries[index], now_ms);
        }
        self.hand = start + looked;
        let Sample {
            mut full,
            least_recent,
            until_ms,
        } = sample;
        if full.is_empty() {
            let (index, _) = least_recent.ok_or(NoRoom { until_ms })?;
            self.remove_index(index);
            return Ok(());
        }
        // Highest index first, so earlier swap_removes do not move the later ones.
        full.sort_unstable_by(|a, b| b.cmp(a));
        for index in full {
            self.remove_index(index);
        }
        Ok(())
    }
}

/// What a look at the entries under the clock hand found, as displacing sees them.
struct Sample {
    /// Entries back to full (forgetting them changes no decision), in the order looked at.
    full: SmallVec<[usize; EVICTION_SAMPLE]>,
    /// The least recently used entry not over its limit, and when it was used.
    least_recent: Option<(usize, i64)>,
    /// The earliest time an entry over its limit is back to full (`i64::MAX`: none seen).
    until_ms: i64,
}

// === impl Sample ===

impl Sample {
    fn new() -> Self {
        Self {
            full: SmallVec::new(),
            least_recent: None,
            until_ms: i64::MAX,
        }
    }

    /// Files the entry at `index`: back to full, a candidate by recency, or over its limit until it expires.
    fn consider(&mut self, index: usize, entry: &Entry, now_ms: i64) {
        if entry.expires_at_ms <= now_ms {
            self.full.push(index);
        } else if !entry.over_limit {
            if self
                .least_recent
                .is_none_or(|(_, used)| entry.used_ms < used)
            {
                self.least_recent = Some((index, entry.used_ms));
            }
        } else {
            self.until_ms = self.until_ms.min(entry.expires_at_ms);
        }
    }
}
