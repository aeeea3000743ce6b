//! The in-process store's clock in tests: every window a test uses begins when its gateway starts.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use tollgate::limiter::Clock;

/// 2025-12-18T00:00:00Z: a whole number of weeks since the epoch, so that a fixed or sliding window of a second,
/// a minute, an hour, a day or a week begins there (windows are aligned on multiples of their period).
pub const WINDOW_START_MS: i64 = 1_766_016_000_000;

/// Reads [`WINDOW_START_MS`] when made, then runs with real time (leases expire, buckets refill) plus whatever a
/// test [`advance`](Self::advance)s it by. A test on it never sees a window of an hour, a day or a week end
/// unless it says so: no test waits for a boundary to pass, and none is split by one.
#[derive(Debug)]
pub struct TestClock {
    started: Instant,
    advanced_ms: AtomicI64,
}

impl TestClock {
    /// A clock at [`WINDOW_START_MS`].
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            advanced_ms: AtomicI64::new(0),
        }
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance(&self, ms: i64) {
        self.advanced_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX);
        WINDOW_START_MS + elapsed + self.advanced_ms.load(Ordering::SeqCst)
    }
}
