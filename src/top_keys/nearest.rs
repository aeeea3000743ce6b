//! The keys nearest a limit: the last state seen of the few that have used the largest share of it lately, in a
//! fixed number of entries.

/// Entries kept per limit: the dashboard shows ten across all plans.
pub const NEAREST: usize = 16;
/// A state seen longer ago than this is no longer shown, and is the first replaced.
const FRESH_MS: i64 = 60_000;

/// What a key had used of its limit when last seen.
#[derive(Debug, Clone, PartialEq)]
pub struct Near {
    /// The key's value as the store key holds it (a digest for a secret).
    pub key: String,
    /// What it had used, of `capacity`.
    pub used: u64,
    /// The limit's capacity for it (an override's where one applies).
    pub capacity: u64,
    /// When, ms since the epoch.
    pub at_ms: i64,
}

/// At most [`NEAREST`] keys with their last state.
#[derive(Debug, Default)]
pub(super) struct Nearest {
    entries: Vec<Near>,
}

// === impl Near ===

impl Near {
    /// The share of the limit used: 1 at the limit (or past it, for a key that owes).
    pub fn share(&self) -> f64 {
        self.used as f64 / self.capacity.max(1) as f64
    }
}

// === impl Nearest ===

impl Nearest {
    /// Notes that `key` had used `used` of `capacity` at `now_ms`: its entry updated, or a new one taking the
    /// place of a state gone stale or of the smallest share, if it is smaller.
    pub(super) fn record(&mut self, now_ms: i64, key: &str, used: u64, capacity: u64) {
        let seen = Near {
            key: String::new(),
            used,
            capacity,
            at_ms: now_ms,
        };
        if let Some(entry) = self.entries.iter_mut().find(|e| e.key == key) {
            entry.used = used;
            entry.capacity = capacity;
            entry.at_ms = now_ms;
            return;
        }
        if self.entries.len() < NEAREST {
            self.entries.push(Near {
                key: key.to_owned(),
                ..seen
            });
            return;
        }
        let rank = |e: &Near| match now_ms - e.at_ms > FRESH_MS {
            true => -1.0,
            false => e.share(),
        };
        let lowest = self
            .entries
            .iter_mut()
            .min_by(|a, b| rank(a).total_cmp(&rank(b)));
        if let Some(lowest) = lowest.filter(|lowest| rank(lowest) < seen.share()) {
            lowest.key.clear();
            lowest.key.push_str(key);
            (lowest.used, lowest.capacity, lowest.at_ms) = (used, capacity, now_ms);
        }
    }

    /// The keys seen in the last minute, the largest share first.
    pub(super) fn list(&self, now_ms: i64) -> Vec<Near> {
        let mut fresh: Vec<Near> = self
            .entries
            .iter()
            .filter(|e| now_ms - e.at_ms <= FRESH_MS)
            .cloned()
            .collect();
        fresh.sort_by(|a, b| {
            b.share()
                .total_cmp(&a.share())
                .then_with(|| a.key.cmp(&b.key))
        });
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_nearest_their_limit_are_kept_in_a_fixed_number_of_entries() {
        let mut nearest = Nearest::default();
        // Many keys at a tenth of their limit, then one at nine tenths, one at the limit.
        for i in 0..1_000 {
            nearest.record(0, &format!("light-{i}"), 10, 100);
        }
        nearest.record(1, "heavy", 90, 100);
        nearest.record(2, "full", 100, 100);
        assert_eq!(nearest.entries.len(), NEAREST);
        let list = nearest.list(2);
        assert_eq!(list[0].key, "full");
        assert_eq!(list[1].key, "heavy");
        assert_eq!(list[1].share(), 0.9);
        // A key seen again is updated in place; a minute later, what was seen is no longer shown.
        nearest.record(20, "heavy", 95, 100);
        assert_eq!(nearest.list(20)[1].used, 95);
        nearest.record(FRESH_MS + 10, "late", 1, 100);
        let later = nearest.list(FRESH_MS + 10);
        assert_eq!(
            later.iter().map(|n| n.key.as_str()).collect::<Vec<_>>(),
            ["heavy", "late"]
        );
    }
}
