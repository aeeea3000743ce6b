//! The heaviest keys of each limit over the last minute and the last five, admitted and denied apart, in a fixed
//! number of counters per limit (Space-Saving), recorded as decisions are counted.
//!
//! What it costs a request: a denial is always recorded (a lock of its limit's sketch, a hash and an increment:
//! little beside the 429 it is answered with, and it lets the first look at a page show who was denied in the last
//! five minutes). An admission is recorded only while someone looks: for [`WATCH_FOR`] after the last read of
//! `/top` or `/stats` (the dashboard reads `/stats` every second). While no one looks, an admitted request pays one
//! relaxed atomic load.

mod nearest;
mod sketch;
mod window;

pub use nearest::{Near, NEAREST};
pub use sketch::{Counts, COUNTERS};
pub use window::Window;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use nearest::Nearest;
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

/// The top keys of one limit: one sketch per minute of the last six, behind the limit's own lock; and for a plan's
/// limit, the keys (consumers) nearest it.
#[derive(Debug, Default)]
pub struct LimitTop {
    minutes: Mutex<Minutes>,
    nearest: Option<Mutex<Nearest>>,
}

/// What one request's decision said of one limit and its key.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// The key's value as the store key holds it (a secret's digest, never the secret).
    pub key: &'a str,
    /// Whether the limit denied the request (or, a shadow limit, would have).
    pub denied: bool,
    /// What the key had used of the limit once decided, of `capacity`.
    pub used: u64,
    /// The limit's capacity for the key.
    pub capacity: u64,
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
    /// The top keys of a plan's limit, which also keeps the consumers nearest it.
    pub fn for_plan() -> Self {
        Self {
            nearest: Some(Mutex::default()),
            ..Self::default()
        }
    }

    /// Takes over what `before` saw, the same limit in the config a reload replaces: its minutes and, for a plan's
    /// limit, the consumers nearest it. A reload changes no key's count, so it must not empty the page showing them.
    pub fn take_from(&self, before: &LimitTop) {
        let minutes = std::mem::take(&mut *before.minutes.lock());
        *self.minutes.lock() = minutes;
        if let (Some(nearest), Some(before)) = (&self.nearest, &before.nearest) {
            let taken = std::mem::take(&mut *before.lock());
            *nearest.lock() = taken;
        }
    }

    /// Records one request as `seen`: denied, always; admitted, while `watch` says someone looks.
    pub fn record(&self, watch: &Watch, seen: Seen<'_>) {
        self.record_at(watch, now_ms(), seen);
    }

    fn record_at(&self, watch: &Watch, now_ms: i64, seen: Seen<'_>) {
        if !seen.denied && !watch.still(now_ms) {
            return;
        }
        self.minutes.lock().record(now_ms, seen.key, seen.denied);
        if let Some(nearest) = &self.nearest {
            nearest
                .lock()
                .record(now_ms, seen.key, seen.used, seen.capacity);
        }
    }

    /// For a plan's limit, the keys seen in the last minute nearest it, the largest share first.
    pub fn nearest(&self, now_ms: i64) -> Vec<Near> {
        self.nearest
            .as_ref()
            .map_or_else(Vec::new, |nearest| nearest.lock().list(now_ms))
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
        let seen = |key, denied| Seen {
            key,
            denied,
            used: 1,
            capacity: 10,
        };
        top.record_at(&watch, at, seen("quiet", false));
        top.record_at(&watch, at, seen("denied", true));
        assert_eq!(watch.since_ms(), None);
        let shown = top.top(at, 20);
        let keys: Vec<&str> = shown
            .one_minute
            .keys
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(keys, ["denied"]);

        watch.look(at);
        assert_eq!(watch.since_ms(), Some(at));
        top.record_at(&watch, at + 1, seen("looked", false));
        assert!(top
            .top(at + 1, 20)
            .one_minute
            .keys
            .iter()
            .any(|(k, _)| k == "looked"));
        // Past WATCH_FOR, the next admission turns the recording off.
        let late = at + WATCH_FOR.as_millis() as i64 + 1;
        top.record_at(&watch, late, seen("too-late", false));
        assert!(!watch.watched());
        assert!(!top
            .top(late, 20)
            .five_minutes
            .keys
            .iter()
            .any(|(k, _)| k == "too-late"));
        // Only a plan's limit keeps the keys nearest it.
        assert!(top.nearest(late).is_empty());
        let plan = LimitTop::for_plan();
        plan.record_at(&watch, late, seen("acme", true));
        assert_eq!(plan.nearest(late)[0].share(), 0.1);
    }
}
