//! Redis's clock as this process last saw it: a request's deadline told to the script in Redis's time, so that a
//! call reaching Redis after its request was answered without it changes nothing.
//!
//! Every script reply starts with Redis's time. Read when the reply arrives, it is the time of some moment between
//! sending and receiving, so `redis_now - local_now_at_receipt` never exceeds the true offset between the two
//! clocks: a deadline translated with it is never later than the true one. It is earlier by the reply's way back,
//! which the best (largest) sample of the last seconds keeps to a fraction of a millisecond on a quiet link; a
//! sample older than two windows is forgotten, so that a Redis replaced by one with another clock (a failover,
//! a clock stepped back) is followed within two seconds.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// How long one window of samples lasts; the estimate is the best sample of the current and previous window.
const WINDOW: Duration = Duration::from_secs(1);

/// The offset of Redis's clock from this process's, estimated from script replies.
#[derive(Debug, Default)]
pub(super) struct RedisClock {
    samples: Mutex<Samples>,
}

/// Redis's clock against this process's at one moment (see [`RedisClock::reading`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct ClockReading {
    /// Redis's µs minus local µs.
    offset_us: i64,
}

/// The best offsets (Redis's µs minus local µs) seen in the current and the previous window.
#[derive(Debug, Default)]
struct Samples {
    window_start_us: i64,
    current: Option<i64>,
    previous: Option<i64>,
}

// === impl RedisClock ===

impl RedisClock {
    /// Takes Redis's time from a reply received at `received`.
    pub(super) fn observe(&self, redis_now_ms: i64, received: Instant) {
        let local_us = local_us(received);
        let offset = redis_now_ms.saturating_mul(1_000).saturating_sub(local_us);
        let mut samples = self.lock();
        samples.rotate(local_us);
        samples.current = Some(samples.current.map_or(offset, |best| best.max(offset)));
    }

    /// `deadline` in Redis's milliseconds, never later than the true one while the clocks keep their pace; from
    /// this host's wall clock until a reply was seen.
    pub(super) fn redis_ms(&self, deadline: Instant) -> u64 {
        self.reading().redis_ms(deadline)
    }

    /// The estimate as it stands now, to translate several deadlines with: a batch's are all translated with one
    /// reading (one look at the clock and the samples), not one each.
    pub(super) fn reading(&self) -> ClockReading {
        let offset = {
            let mut samples = self.lock();
            samples.rotate(local_us_now());
            samples.current.max(samples.previous)
        };
        ClockReading {
            offset_us: offset.unwrap_or_else(wall_offset_us),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Samples> {
        // Plain numbers: whatever a panic left is still a valid estimate.
        self.samples.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// === impl ClockReading ===

impl ClockReading {
    /// `deadline` in Redis's milliseconds (see [`RedisClock::redis_ms`]).
    pub(super) fn redis_ms(&self, deadline: Instant) -> u64 {
        u64::try_from(local_us(deadline).saturating_add(self.offset_us) / 1_000).unwrap_or(0)
    }
}

// === impl Samples ===

impl Samples {
    /// Starts a new window when the current one is over; samples two windows old are dropped.
    fn rotate(&mut self, now_us: i64) {
        let window = WINDOW.as_micros() as i64;
        let elapsed = now_us.saturating_sub(self.window_start_us);
        if elapsed < window {
            return;
        }
        self.previous = if elapsed < 2 * window {
            self.current.take()
        } else {
            self.current = None;
            None
        };
        self.window_start_us = now_us;
    }
}

/// Microseconds since this process first asked, on the monotonic clock (tokio's, so paused in tests).
fn local_us(at: Instant) -> i64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    // An instant before the epoch (a deadline is never one) counts as the epoch.
    i64::try_from(at.saturating_duration_since(epoch).as_micros()).unwrap_or(i64::MAX)
}

fn local_us_now() -> i64 {
    local_us(Instant::now())
}

/// This host's wall clock against the monotonic one: Redis's clock before any reply told it.
fn wall_offset_us() -> i64 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as i64);
    wall - local_us_now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_told_in_redis_time_by_the_best_recent_sample() {
        let clock = RedisClock::default();
        let start = Instant::now();
        let base = local_us(start);
        // Redis is 5 s ahead; one reply took 3 ms to come back, the next 0.
        clock.observe((base + 5_000_000) / 1_000, start + Duration::from_millis(3));
        let slow = clock.redis_ms(start + Duration::from_millis(25));
        assert_eq!(slow as i64, (base + 5_000_000 + 25_000 - 3_000) / 1_000);
        clock.observe(
            (base + 5_000_000) / 1_000 + 4,
            start + Duration::from_millis(4),
        );
        let best = clock.redis_ms(start + Duration::from_millis(25));
        assert_eq!(best as i64, (base + 5_000_000 + 25_000) / 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn samples_older_than_two_windows_are_forgotten() {
        let clock = RedisClock::default();
        let start = Instant::now();
        let base = local_us(start);
        // Redis 10 s ahead, then replaced by one on this host's time.
        clock.observe((base + 10_000_000) / 1_000, start);
        tokio::time::advance(WINDOW).await;
        let later = Instant::now();
        clock.observe(local_us(later) / 1_000, later);
        // The old sample is still the best for one more window (the estimate is never later than the true time
        // only while a server keeps its clock), and a second window forgets it.
        assert_eq!(
            clock.redis_ms(later) as i64,
            (local_us(later) + 10_000_000) / 1_000
        );
        tokio::time::advance(2 * WINDOW).await;
        let now = Instant::now();
        clock.observe(local_us(now) / 1_000, now);
        assert_eq!(clock.redis_ms(now) as i64, local_us(now) / 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn one_reading_tells_several_deadlines_as_the_clock_tells_each() {
        let clock = RedisClock::default();
        let start = Instant::now();
        clock.observe((local_us(start) + 7_000_000) / 1_000, start);
        let reading = clock.reading();
        for ms in [0, 1, 25, 999] {
            let deadline = start + Duration::from_millis(ms);
            assert_eq!(reading.redis_ms(deadline), clock.redis_ms(deadline), "{ms}");
        }
    }

    #[test]
    fn before_any_reply_the_wall_clock_stands_in() {
        let clock = RedisClock::default();
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as i64;
        let told = clock.redis_ms(Instant::now() + Duration::from_secs(1)) as i64;
        assert!((told - now_ms - 1_000).abs() < 100, "{told} vs {now_ms}");
    }
}
