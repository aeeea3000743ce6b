//! The last minutes of one limit's keys: one sketch per minute of the clock, the last minute and the last five
//! merged from them when asked.

use std::collections::HashMap;

use super::sketch::{Counts, Sketch};

/// Minutes kept: the current one and the five before it, of which the oldest only partly falls in the last five
/// minutes.
const MINUTES: usize = 6;
const MINUTE_MS: i64 = 60_000;

/// One sketch per minute, each made when its minute first records (a limit no request meets holds nothing), and
/// reused six minutes later.
#[derive(Debug, Default)]
pub(super) struct Minutes {
    slots: [Option<Box<Minute>>; MINUTES],
}

#[derive(Debug)]
struct Minute {
    /// Which minute of the clock (ms since the epoch / 60,000) the sketch counts.
    minute: i64,
    sketch: Sketch,
}

/// The heaviest keys of a window.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// The keys, heaviest first (by the most each may have had).
    pub keys: Vec<(String, Counts)>,
    /// The requests the window counted, all keys together.
    pub events: u64,
}

// === impl Minutes ===

impl Minutes {
    /// Counts one request of `key` at `now_ms`, in its minute's sketch.
    pub(super) fn record(&mut self, now_ms: i64, key: &str, denied: bool) {
        let minute = now_ms.div_euclid(MINUTE_MS);
        let slot = &mut self.slots[minute.rem_euclid(MINUTES as i64) as usize];
        let current = slot.get_or_insert_with(|| {
            Box::new(Minute {
                minute,
                sketch: Sketch::new(),
            })
        });
        if current.minute != minute {
            current.minute = minute;
            current.sketch.clear();
        }
        current.sketch.record(key, denied);
    }

    /// The `n` heaviest keys of the `minutes` (1 to 5) before `now_ms`.
    ///
    /// The minutes wholly inside the window count whole; the oldest, of which the window holds only the part
    /// still to come in the current minute, counts in proportion, as if its requests were spread evenly over it
    /// (the estimate a sliding window limit makes). A key a minute does not hold may have had up to that minute's
    /// floor there, which its error includes.
    pub(super) fn window(&self, now_ms: i64, minutes: i64, n: usize) -> Window {
        let start = now_ms - minutes * MINUTE_MS;
        let weighted: Vec<(f64, &Sketch)> = self
            .slots
            .iter()
            .flatten()
            .filter(|m| m.minute * MINUTE_MS <= now_ms)
            .map(|m| {
                let inside = ((m.minute + 1) * MINUTE_MS - start).clamp(0, MINUTE_MS);
                (inside as f64 / MINUTE_MS as f64, &m.sketch)
            })
            .filter(|(weight, _)| *weight > 0.0)
            .collect();
        // Per key: admitted, denied, error, and which minutes held it.
        let mut merged: HashMap<&str, ([f64; 3], u64)> = HashMap::new();
        for (held_in, (weight, sketch)) in weighted.iter().enumerate() {
            for (key, counts) in sketch.entries() {
                let (sums, held) = merged.entry(key).or_default();
                sums[0] += weight * counts.admitted as f64;
                sums[1] += weight * counts.denied as f64;
                sums[2] += weight * counts.error as f64;
                *held |= 1 << held_in;
            }
        }
        let mut keys: Vec<(String, Counts)> = merged
            .into_iter()
            .map(|(key, (mut sums, held))| {
                for (i, (weight, sketch)) in weighted.iter().enumerate() {
                    if held & (1 << i) == 0 {
                        sums[2] += weight * sketch.floor() as f64;
                    }
                }
                let counts = Counts {
                    admitted: sums[0].round() as u64,
                    denied: sums[1].round() as u64,
                    error: sums[2].ceil() as u64,
                };
                (key.to_owned(), counts)
            })
            .collect();
        keys.sort_by(|(a, x), (b, y)| y.upper().cmp(&x.upper()).then_with(|| a.cmp(b)));
        keys.truncate(n);
        let events = weighted
            .iter()
            .map(|(weight, sketch)| weight * sketch.events() as f64)
            .sum::<f64>()
            .round() as u64;
        Window { keys, events }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 12:00:00 on some day, in ms since the epoch: the start of a minute.
    const NOON: i64 = 1_700_000_040_000;

    fn counts(window: &Window, key: &str) -> Option<Counts> {
        window.keys.iter().find(|(k, _)| k == key).map(|(_, c)| *c)
    }

    #[test]
    fn the_last_minute_counts_the_minute_before_in_proportion_and_five_minutes_count_them_all() {
        let mut minutes = Minutes::default();
        for _ in 0..60 {
            minutes.record(NOON + 10_000, "old", true);
        }
        for _ in 0..10 {
            minutes.record(NOON + MINUTE_MS + 5_000, "new", false);
        }
        // 15 s into the next minute: three quarters of the minute before are in the last minute.
        let now = NOON + MINUTE_MS + 15_000;
        let last = minutes.window(now, 1, 20);
        assert_eq!(
            counts(&last, "old"),
            Some(Counts {
                admitted: 0,
                denied: 45,
                error: 0
            })
        );
        assert_eq!(counts(&last, "new").map(|c| c.admitted), Some(10));
        assert_eq!(last.events, 55);
        assert_eq!(last.keys[0].0, "old");
        let five = minutes.window(now, 5, 20);
        assert_eq!(counts(&five, "old").map(|c| c.denied), Some(60));
        assert_eq!(five.events, 70);
        // Two minutes on, the old minute has left the last minute; seven minutes on, the new one the last five.
        assert_eq!(
            counts(&minutes.window(NOON + 2 * MINUTE_MS, 1, 20), "old"),
            None
        );
        let gone = minutes.window(NOON + 7 * MINUTE_MS + 1, 5, 20);
        assert_eq!(gone.events, 0);
        assert!(gone.keys.is_empty());
    }

    #[test]
    fn a_minute_six_minutes_on_starts_afresh_in_the_same_sketch() {
        let mut minutes = Minutes::default();
        minutes.record(NOON, "a", false);
        minutes.record(NOON + 6 * MINUTE_MS, "b", false);
        let window = minutes.window(NOON + 6 * MINUTE_MS, 5, 20);
        assert_eq!(window.keys.len(), 1);
        assert_eq!(window.keys[0].0, "b");
        assert_eq!(minutes.slots.iter().flatten().count(), 1);
    }

    #[test]
    fn a_key_a_full_minute_missed_has_that_minute_s_floor_in_its_error() {
        let mut minutes = Minutes::default();
        // Minute one: 64 keys twice each fill the sketch, and its floor is 2.
        for i in 0..64 {
            minutes.record(NOON, &i.to_string(), false);
            minutes.record(NOON, &i.to_string(), false);
        }
        minutes.record(NOON + MINUTE_MS, "late", true);
        let window = minutes.window(NOON + MINUTE_MS, 5, 100);
        assert_eq!(
            counts(&window, "late"),
            Some(Counts {
                admitted: 0,
                denied: 1,
                error: 2
            })
        );
        assert_eq!(window.keys.len(), 65);
        assert_eq!(minutes.window(NOON + MINUTE_MS, 5, 3).keys.len(), 3);
    }
}
