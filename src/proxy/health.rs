//! Passive health of one upstream target: failures counted as requests meet them, nginx's `max_fails` and
//! `fail_timeout`, read by the request path with one atomic load while the target is up.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use super::settings::HealthSettings;

/// The passive health of one target.
///
/// The request path reads `down_until` (one relaxed load) to pick a target and `fails` (another) after an answer;
/// while both are 0, nothing else is touched. Failures are rare and take the lock.
#[derive(Debug)]
pub(crate) struct TargetHealth {
    settings: HealthSettings,
    /// The instant the millisecond counts below start from.
    epoch: Instant,
    /// Milliseconds since `epoch`, plus 1, until which the target is skipped; 0 while it is not.
    down_until: AtomicU64,
    /// Failures counted since the last success; a success resets them only when there are some.
    fails: AtomicU32,
    record: Mutex<Record>,
    upstream: String,
    target: String,
}

/// Why a target failed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No connection: refused, timed out, or its TLS handshake failed.
    Connect,
    /// The connection closed or reset before any byte of an answer.
    Reset,
    /// No response head within the upstream's timeout (or its `idle_timeout`).
    Timeout,
    /// The answer stopped for longer than `idle_timeout`.
    Idle,
}

/// Where a target stands, as `GET /upstreams` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HealthView {
    pub state: &'static str,
    /// Failures counted since the last success.
    pub fails: u32,
    /// How much longer the target is skipped.
    pub down_for: Option<Duration>,
    /// Until when it is skipped, by the wall clock.
    pub down_until: Option<SystemTime>,
    /// The last failure: why, and how long ago.
    pub last_failure: Option<(Failure, Duration)>,
}

/// The bookkeeping of failures, under the lock.
#[derive(Debug, Default)]
struct Record {
    /// When the failures counted now began.
    window_start: Option<Instant>,
    fails: u32,
    last: Option<(Failure, Instant)>,
    /// Whether the target was skipped since its last success: one more failure skips it again at once (nginx).
    was_down: bool,
}

// === impl TargetHealth ===

impl TargetHealth {
    /// A target that is up, named `target` in `upstream` for `/upstreams`, the metrics and the logs.
    pub(crate) fn new(settings: HealthSettings, upstream: &str, target: &str) -> Self {
        Self {
            settings,
            epoch: Instant::now(),
            down_until: AtomicU64::new(0),
            fails: AtomicU32::new(0),
            record: Mutex::new(Record::default()),
            upstream: upstream.to_owned(),
            target: target.to_owned(),
        }
    }

    /// The target's name (its URL), as the metrics and `/upstreams` show it.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Whether the target is up, without reading the clock: the request path's whole question while it is.
    #[inline]
    pub(crate) fn is_up(&self) -> bool {
        self.down_until.load(Ordering::Relaxed) == 0
    }

    /// Whether the target may be tried at `now`: up, or skipped until a moment now past (it is tried again).
    pub(crate) fn is_available(&self, now: Instant) -> bool {
        let until = self.down_until.load(Ordering::Relaxed);
        until == 0 || self.millis(now) + 1 >= until
    }

    /// A response head came from the target: failures counted so far are forgotten. One load when there are none.
    #[inline]
    pub(crate) fn succeeded(&self) {
        if self.fails.load(Ordering::Relaxed) != 0 {
            self.recovered();
        }
    }

    #[cold]
    #[inline(never)]
    fn recovered(&self) {
        let mut record = self.record.lock();
        let was_down = record.was_down;
        *record = Record {
            last: record.last,
            ..Record::default()
        };
        self.fails.store(0, Ordering::Relaxed);
        self.down_until.store(0, Ordering::Relaxed);
        drop(record);
        if was_down {
            tracing::info!(upstream = %self.upstream, target = %self.target, "upstream target answers again");
        }
    }

    /// The target failed a request at `now`, as `failure` says: counted, and the target skipped for `fail_timeout`
    /// once it failed `max_fails` times within `fail_timeout` (or once more after it was skipped).
    #[cold]
    #[inline(never)]
    pub(crate) fn failed(&self, failure: Failure, now: Instant) {
        let HealthSettings {
            max_fails,
            fail_timeout,
        } = self.settings;
        if max_fails == 0 {
            return;
        }
        let mut record = self.record.lock();
        let expired = record
            .window_start
            .is_none_or(|start| now.saturating_duration_since(start) >= fail_timeout);
        if expired && !record.was_down {
            record.window_start = Some(now);
            record.fails = 0;
        }
        record.fails = record.fails.saturating_add(1);
        record.last = Some((failure, now));
        self.fails.store(record.fails, Ordering::Relaxed);
        if record.fails < max_fails && !record.was_down {
            return;
        }
        record.was_down = true;
        let until = self.millis(now + fail_timeout) + 1;
        self.down_until.store(until, Ordering::Relaxed);
        let fails = record.fails;
        drop(record);
        tracing::warn!(
            upstream = %self.upstream,
            target = %self.target,
            ?failure,
            fails,
            skipped_for = ?fail_timeout,
            "upstream target down: skipped until its fail_timeout passes"
        );
    }

    /// Where the target stands at `now` (a target's skip ends with no request to notice it).
    pub(crate) fn view(&self, now: Instant) -> HealthView {
        let record = self.record.lock();
        let until = self.down_until.load(Ordering::Relaxed);
        let down_for = (until != 0)
            .then(|| Duration::from_millis(until - 1).saturating_sub(now - self.epoch))
            .filter(|left| !left.is_zero());
        let state = match (down_for, record.was_down) {
            (Some(_), _) => "down",
            // Its skip is over and it is tried again; one more failure skips it at once.
            (None, true) => "retrying",
            (None, false) => "up",
        };
        HealthView {
            state,
            fails: record.fails,
            down_for,
            down_until: down_for.map(|left| SystemTime::now() + left),
            last_failure: record
                .last
                .map(|(failure, at)| (failure, now.saturating_duration_since(at))),
        }
    }

    /// Milliseconds from the epoch to `at`.
    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX - 1)
    }
}

// === impl Failure ===

impl Failure {
    /// Its name in `/upstreams`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Reset => "reset",
            Failure::Timeout => "timeout",
            Failure::Idle => "idle_timeout",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(max_fails: u32) -> TargetHealth {
        let settings = HealthSettings {
            max_fails,
            fail_timeout: Duration::from_secs(10),
        };
        TargetHealth::new(settings, "api", "http://127.0.0.1:1")
    }

    #[test]
    fn one_failure_skips_the_target_for_fail_timeout_by_default() {
        let health = health(1);
        let now = Instant::now();
        assert!(health.is_up());
        health.failed(Failure::Connect, now);
        assert!(!health.is_up());
        assert!(!health.is_available(now + Duration::from_millis(9_999)));
        assert!(health.is_available(now + Duration::from_secs(10)));
        assert_eq!(health.view(now).state, "down");
        assert_eq!(health.view(now + Duration::from_secs(10)).state, "retrying");
    }

    #[test]
    fn failures_count_within_fail_timeout_only() {
        let health = health(2);
        let now = Instant::now();
        health.failed(Failure::Reset, now);
        health.failed(Failure::Reset, now + Duration::from_secs(11));
        assert!(health.is_up(), "the first failure was outside the window");
        health.failed(Failure::Reset, now + Duration::from_secs(12));
        assert!(!health.is_up());
    }

    #[test]
    fn after_its_skip_one_failure_skips_again_and_a_success_brings_it_up() {
        let health = health(3);
        let now = Instant::now();
        for _ in 0..3 {
            health.failed(Failure::Connect, now);
        }
        let later = now + Duration::from_secs(10);
        assert!(health.is_available(later));
        health.failed(Failure::Connect, later);
        assert!(!health.is_available(later + Duration::from_secs(1)));
        health.succeeded();
        assert!(health.is_up());
        assert_eq!(health.view(later).state, "up");
        assert_eq!(health.view(later).fails, 0);
    }

    #[test]
    fn max_fails_0_never_skips() {
        let health = health(0);
        for _ in 0..10 {
            health.failed(Failure::Connect, Instant::now());
        }
        assert!(health.is_up());
    }
}
