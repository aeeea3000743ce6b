//! The heaviest keys of each limit over the last minute and the last five, admitted and denied apart, in a fixed
//! number of counters per limit (Space-Saving), recorded as decisions are counted.
//!
//! What it costs a request: a denial is always recorded (a lock of its limit's sketch, a hash and an increment:
//! little beside the 429 it is answered with, and it lets the first look at a page show who was denied in the last
//! five minutes). An admission is recorded only while someone looks: for [`WATCH_FOR`] after the last read of
//! `/top` or `/stats` (the dashboard reads `/stats` every second). While no one looks, an admitted request pays one
//! relaxed atomic load.

mod sketch;
mod window;

pub use sketch::{Counts, COUNTERS};
pub use window::Window;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use window::Minutes;

/// How long admissions are recorded after someone last read the top keys.
pub const WATCH_FOR: Duration = Duration::from_secs(600);

/// Whether someone looks: the one switch of every limit's recording of admissions, in this process.
pub static WATCH: Watch = Watch::new();

/// Whether someone has read the top keys lately, and since when admissions have been recorded.
#[derive(Debug)]
pub struct Watch {
    /// Read by every admitted request; written when someone looks, and when a recording finds the look too old.
    on: AtomicBool,
    /// Until when admissions are recorded, ms since the epoch.
    until_ms: AtomicI64,
    /// Since when admissions have been recorded without a pause, ms since the epoch (0: they are not).
    since_ms: AtomicI64,
}

/// The top keys of one limit: one sketch per minute of the last six, behind the limit's own lock.
#[derive(Debug, Default)]
pub struct LimitTop {
    minutes: Mutex<Minutes>,
}

/// A limit's heaviest keys over the last minute and the last five.
#[derive(Debug, Clone, PartialEq)]
pub struct Top {
    /// The last minute.
    pub one_minute: Window,
    /// The last five minutes.
    pub five_minutes: Window,
}

// === impl Watch ===

impl Watch {
    const fn new() -> Self {
        Self {
            on: AtomicBool::new(false),
            until_ms: AtomicI64::new(0),
            since_ms: AtomicI64::new(0),
        }
    }

    /// Someone looks at `now_ms`: admissions are recorded for [`WATCH_FOR`] from now.
    pub fn look(&self, now_ms: i64) {
        self.until_ms
            .store(now_ms + WATCH_FOR.as_millis() as i64, Ordering::Relaxed);
        if !self.on.swap(true, Ordering::Relaxed) {
            self.since_ms.store(now_ms, Ordering::Relaxed);
        }
    }

    /// Whether admissions are being recorded: one relaxed load, the whole cost of an admission no one looks at.
    #[inline]
    pub fn watched(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Since when admissions have been recorded, if they are.
    pub fn since_ms(&self) -> Option<i64> {
        self.watched()
            .then(|| self.since_ms.load(Ordering::Relaxed))
    }

    /// Whether an admission at `now_ms` is still recorded; the recording stops here once the look is too old.
    fn still(&self, now_ms: i64) -> bool {
        if now_ms <= self.until_ms.load(Ordering::Relaxed) {
            return true;
        }
        self.on.store(false, Ordering::Relaxed);
        false
    }
}

// === impl LimitTop ===

impl LimitTop {
    /// Records one request of the key whose stored value is `key` (a secret key's digest, never its secret):
    /// denied, always; admitted, while `watch` says someone looks.
    pub fn record(&self, watch: &Watch, key: &str, denied: bool) {
        self.record_at(watch, now_ms(), key, denied);
    }

    fn record_at(&self, watch: &Watch, now_ms: i64, key: &str, denied: bool) {
        if denied || watch.still(now_ms) {
            self.minutes.lock().record(now_ms, key, denied);
        }
    }

    /// The `n` heaviest keys of the last minute and the last five at `now_ms`.
    pub fn top(&self, now_ms: i64, n: usize) -> Top {
        let minutes = self.minutes.lock();
        Top {
            one_minute: minutes.window(now_ms, 1, n),
            five_minutes: minutes.window(now_ms, 5, n),
        }
    }
}

/// The wall clock in ms since the epoch, as the windows count minutes.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_are_recorded_only_while_someone_looks_and_denials_always() {
        let watch = Watch::new();
        let top = LimitTop::default();
        let at = 1_700_000_040_000;
        top.record_at(&watch, at, "quiet", false);
        top.record_at(&watch, at, "denied", true);
        assert_eq!(watch.since_ms(), None);
        let seen = top.top(at, 20);
        let keys: Vec<&str> = seen
            .one_minute
            .keys
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(keys, ["denied"]);

        watch.look(at);
        assert_eq!(watch.since_ms(), Some(at));
        top.record_at(&watch, at + 1, "looked", false);
        assert!(top
            .top(at + 1, 20)
            .one_minute
            .keys
            .iter()
            .any(|(k, _)| k == "looked"));
        // Past WATCH_FOR, the next admission turns the recording off.
        let late = at + WATCH_FOR.as_millis() as i64 + 1;
        top.record_at(&watch, late, "too-late", false);
        assert!(!watch.watched());
        assert!(!top
            .top(late, 20)
            .five_minutes
            .keys
            .iter()
            .any(|(k, _)| k == "too-late"));
    }
}
