//! A Space-Saving sketch: the heaviest keys of a stream in a fixed number of counters, whatever the number of keys.

use std::hash::BuildHasher;

use hashbrown::HashTable;

/// Counters per sketch. Space-Saving keeps every key that took more than 1/64 of the sketch's events, and
/// overcounts none by more than 1/64 of them: above 1.6% of a limit's traffic in a minute, a key is never missed.
/// The top 20 a page shows are then well inside what is kept, and 64 keys of at most 64 bytes (longer values are
/// digested before they reach a store key) hold a sketch under 8 KB.
pub const COUNTERS: usize = 64;

/// What one key was counted, admitted and denied apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests the limit admitted while the key held its counter.
    pub admitted: u64,
    /// Requests the limit denied (or, a shadow limit, would have) while the key held its counter.
    pub denied: u64,
    /// What the key may have had before it took its counter: the count of the key it replaced. Its true count
    /// lies between `admitted + denied` and that plus `error`.
    pub error: u64,
}

/// At most [`COUNTERS`] keys with their counts.
#[derive(Debug)]
pub(super) struct Sketch {
    entries: Vec<Entry>,
    /// Each entry's index, found by its key's hash.
    index: HashTable<usize>,
    /// Seeded per sketch: clients choose the keys, and must not choose their collisions.
    hasher: foldhash::fast::RandomState,
    /// Every event recorded, kept or not.
    events: u64,
}

#[derive(Debug)]
struct Entry {
    /// Its allocation reused when another key takes the counter.
    key: String,
    counts: Counts,
}

// === impl Counts ===

impl Counts {
    /// The most the key may have had: what Space-Saving ranks keys by.
    pub fn upper(&self) -> u64 {
        self.admitted + self.denied + self.error
    }
}

// === impl Sketch ===

impl Sketch {
    pub(super) fn new() -> Self {
        Self {
            entries: Vec::with_capacity(COUNTERS),
            index: HashTable::with_capacity(COUNTERS),
            hasher: foldhash::fast::RandomState::default(),
            events: 0,
        }
    }

    /// Forgets every key, keeping the allocations.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.index.clear();
        self.events = 0;
    }

    /// Counts one request of `key`: on its counter, or on the smallest one, which it takes over.
    pub(super) fn record(&mut self, key: &str, denied: bool) {
        self.events += 1;
        let Self {
            entries,
            index,
            hasher,
            ..
        } = self;
        let hash = hasher.hash_one(key);
        let at = match index.find(hash, |&i| entries[i].key == key) {
            Some(&at) => at,
            None if entries.len() < COUNTERS => {
                entries.push(Entry {
                    key: key.to_owned(),
                    counts: Counts::default(),
                });
                let at = entries.len() - 1;
                index.insert_unique(hash, at, |&i| hasher.hash_one(&entries[i].key));
                at
            }
            None => {
                let at = smallest(entries);
                let old = hasher.hash_one(&entries[at].key);
                if let Ok(found) = index.find_entry(old, |&i| i == at) {
                    found.remove();
                }
                let entry = &mut entries[at];
                entry.counts = Counts {
                    error: entry.counts.upper(),
                    ..Counts::default()
                };
                entry.key.clear();
                entry.key.push_str(key);
                index.insert_unique(hash, at, |&i| hasher.hash_one(&entries[i].key));
                at
            }
        };
        let counts = &mut entries[at].counts;
        match denied {
            true => counts.denied += 1,
            false => counts.admitted += 1,
        }
    }

    /// The keys held, with their counts.
    pub(super) fn entries(&self) -> impl Iterator<Item = (&str, Counts)> + '_ {
        self.entries.iter().map(|e| (e.key.as_str(), e.counts))
    }

    /// The most a key the sketch does not hold may have had: the smallest counter once all are taken, else 0.
    pub(super) fn floor(&self) -> u64 {
        match self.entries.len() < COUNTERS {
            true => 0,
            false => self.entries[smallest(&self.entries)].counts.upper(),
        }
    }

    /// Every event recorded.
    pub(super) fn events(&self) -> u64 {
        self.events
    }
}

/// The index of the entry with the smallest count (there is one: called on a full sketch). A scan of 64 counts,
/// made only when a key without a counter arrives.
fn smallest(entries: &[Entry]) -> usize {
    entries
        .iter()
        .enumerate()
        .min_by_key(|(_, e)| e.counts.upper())
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_heavy_hitter_is_found_among_many_light_keys_in_a_fixed_number_of_counters() {
        let mut sketch = Sketch::new();
        // 100,000 keys seen once each, and one key every tenth request.
        for i in 0..100_000u32 {
            sketch.record(&format!("10.0.{}.{}", i / 256, i % 256), false);
            if i % 10 == 0 {
                sketch.record("flooder", true);
            }
        }
        assert_eq!(sketch.entries().count(), COUNTERS);
        let (top, counts) = sketch
            .entries()
            .max_by_key(|(_, c)| c.upper())
            .expect("a key");
        assert_eq!(top, "flooder");
        assert!(counts.denied + counts.error >= 10_000, "{counts:?}");
        assert!(counts.denied <= 10_000, "{counts:?}");
        assert_eq!(counts.admitted, 0);
        assert_eq!(sketch.events(), 110_000);
    }

    #[test]
    fn a_cleared_sketch_holds_nothing() {
        let mut sketch = Sketch::new();
        sketch.record("a", false);
        sketch.clear();
        assert_eq!(sketch.entries().count(), 0);
        assert_eq!(sketch.floor(), 0);
        sketch.record("b", true);
        let all: Vec<_> = sketch.entries().collect();
        assert_eq!(
            all,
            [(
                "b",
                Counts {
                    admitted: 0,
                    denied: 1,
                    error: 0
                }
            )]
        );
    }

    proptest! {
        /// Whatever the stream: at most 64 counters; every key held has its true count between its counts and
        /// its counts plus its error (admitted and denied each no more than the truth); a key not held had no
        /// more than the floor; and any key over 1/64 of the events is held.
        #[test]
        fn the_error_bound_holds(stream in prop::collection::vec((0u16..2_000, any::<bool>()), 0..3_000)) {
            let mut sketch = Sketch::new();
            let mut truth: HashMap<String, (u64, u64)> = HashMap::new();
            for (key, denied) in &stream {
                // A skewed stream: half the requests from 7 heavy clients, half from a thousand light ones, far
                // more keys than counters.
                let key = match key % 2 {
                    0 => key % 7,
                    _ => *key,
                }
                .to_string();
                sketch.record(&key, *denied);
                let counted = truth.entry(key).or_default();
                if *denied { counted.1 += 1 } else { counted.0 += 1 }
            }
            prop_assert!(sketch.entries().count() <= COUNTERS);
            let held: HashMap<&str, Counts> = sketch.entries().collect();
            for (key, &(admitted, denied)) in &truth {
                match held.get(key.as_str()) {
                    Some(counts) => {
                        prop_assert!(counts.admitted <= admitted && counts.denied <= denied);
                        prop_assert!(admitted + denied <= counts.upper());
                    }
                    None => prop_assert!(admitted + denied <= sketch.floor()),
                }
                if (admitted + denied) * COUNTERS as u64 > stream.len() as u64 {
                    prop_assert!(held.contains_key(key.as_str()), "{key} is heavy but not held");
                }
            }
            prop_assert!(sketch.floor() <= stream.len() as u64 / COUNTERS as u64);
        }
    }
}
