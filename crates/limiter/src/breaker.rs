//! A circuit breaker for the shared store: after consecutive failures, stop asking Redis (answer by the
//! `on_error` policy at once) until a background probe sees it answer again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Consecutive failures that open the circuit. One failure may be a lost packet; three in a row is an outage.
const FAILURES_TO_OPEN: u32 = 3;

/// Whether requests should be sent to Redis.
#[derive(Debug, Default)]
pub struct CircuitBreaker {
    consecutive_failures: AtomicU32,
    open: AtomicBool,
}

/// What a failure did to the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tripped {
    /// The circuit just opened: start probing.
    Opened,
    /// Nothing changed.
    No,
}

impl CircuitBreaker {
    /// True while Redis is considered down: requests must not wait for it.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Records a successful call; returns true if this closed an open circuit.
    pub fn record_success(&self) -> bool {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.open.swap(false, Ordering::AcqRel)
    }

    /// Records a failed call.
    pub fn record_failure(&self) -> Tripped {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= FAILURES_TO_OPEN && !self.open.swap(true, Ordering::AcqRel) {
            return Tripped::Opened;
        }
        Tripped::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_only() {
        let breaker = CircuitBreaker::default();
        assert_eq!(breaker.record_failure(), Tripped::No);
        assert_eq!(breaker.record_failure(), Tripped::No);
        breaker.record_success();
        assert_eq!(breaker.record_failure(), Tripped::No);
        assert_eq!(breaker.record_failure(), Tripped::No);
        assert_eq!(breaker.record_failure(), Tripped::Opened);
        assert!(breaker.is_open());
        assert_eq!(breaker.record_failure(), Tripped::No, "already open");
        assert!(breaker.record_success());
        assert!(!breaker.is_open());
    }
}
