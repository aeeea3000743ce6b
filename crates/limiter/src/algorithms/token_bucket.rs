//! `token_bucket`: `burst` tokens refilled continuously at `rate`, with fractional refill kept exactly.

use super::settle::Settlement;
use super::{ceil_div, Transition};
use crate::{Decision, Rate};

/// The bucket's level and when it was last updated.
///
/// Tokens are counted in units of `1 / rate.count` of a token-period, so that refilling `elapsed_ms` adds exactly
/// `elapsed_ms × rate.count` units and no fraction of a token is ever rounded away. One token is
/// `rate.period_ms` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// Level in scaled units. Below zero while a `token_bucket` is in debt (a request settled for more than it
    /// reserved): refilling pays the debt first.
    pub level: i64,
    /// When `level` was computed.
    pub updated_ms: i64,
    /// `token_bucket`: the capacity (scaled) `level` was computed under, so that a burst raised since gives its
    /// new room at once (the bucket keeps the tokens it lacks). 0 when unknown: a `leaky_bucket`'s meter, or a
    /// bucket an earlier build wrote.
    pub capacity: u64,
}

impl BucketState {
    /// The level under `capacity`: raised by what a larger burst added since it was written.
    fn level_under(&self, capacity: u64) -> i64 {
        if self.capacity != 0 && self.capacity < capacity {
            self.level + (capacity - self.capacity) as i64
        } else {
            self.level
        }
    }

    /// The level at `now_ms` of a bucket of `capacity` refilled `per_ms` units each millisecond.
    pub(super) fn refilled(&self, capacity: u64, per_ms: u64, now_ms: i64) -> i64 {
        let stored = self.level_under(capacity);
        let elapsed = (now_ms - self.updated_ms).max(0) as u64;
        let capacity = capacity as i64;
        // Compared, not added, so a long idle time cannot overflow.
        if elapsed.saturating_mul(per_ms) >= (capacity - stored).max(0) as u64 {
            capacity
        } else {
            stored + (elapsed * per_ms) as i64
        }
    }
}

/// Evaluates a request of `cost` at `now_ms`.
pub fn evaluate(
    rate: Rate,
    burst: u64,
    state: Option<&BucketState>,
    now_ms: i64,
    cost: u64,
) -> Transition<BucketState> {
    let unit = rate.period_ms();
    let per_ms = rate.count();
    let capacity = burst * unit;
    let level = state.map_or(capacity as i64, |s| s.refilled(capacity, per_ms, now_ms));
    let need = (cost * unit) as i64;
    // Time to full: longer by the debt's refill time while the level is below zero.
    let to_full = |level: i64| ceil_div((capacity as i64 - level) as u64, per_ms);
    let tokens = |level: i64| level.max(0) as u64 / unit;
    // Below zero the bucket owes: whole tokens, rounded up, as the script's signed floor division gives them.
    let owed = if level < 0 {
        level.unsigned_abs().div_ceil(unit)
    } else {
        0
    };
    let standing_reset = to_full(level);

    if level >= need {
        let after = level - need;
        let reset = to_full(after);
        let admitted = Decision {
            allowed: true,
            limit: burst,
            remaining: tokens(after),
            retry_after_ms: 0,
            reset_after_ms: reset,
            delay_ms: 0,
            owed: 0,
        };
        let standing = Decision {
            remaining: tokens(level),
            reset_after_ms: standing_reset,
            ..admitted
        };
        return Transition {
            admitted,
            standing,
            next: BucketState {
                level: after,
                updated_ms: now_ms,
                capacity,
            },
            ttl_ms: reset,
        };
    }

    let denied = Decision {
        allowed: false,
        limit: burst,
        remaining: tokens(level),
        retry_after_ms: ceil_div((need - level) as u64, per_ms),
        reset_after_ms: standing_reset,
        delay_ms: 0,
        owed,
    };
    Transition {
        admitted: denied,
        standing: denied,
        next: BucketState {
            level,
            updated_ms: now_ms,
            capacity,
        },
        ttl_ms: standing_reset,
    }
}

/// The bucket once `settlement` is applied at `now_ms`, with how long to keep it (see [`Settlement`]): a debt takes
/// it below empty, down to minus its capacity.
pub fn settle(
    rate: Rate,
    burst: u64,
    state: Option<&BucketState>,
    now_ms: i64,
    settlement: Settlement,
) -> Option<(BucketState, u64)> {
    let (unit, per_ms) = (rate.period_ms(), rate.count());
    let capacity = burst * unit;
    let level = match state {
        Some(s) => s.refilled(capacity, per_ms, now_ms),
        None => settlement.or_fresh(capacity as i64)?,
    };
    // What the bucket lacks of full.
    let taken = settlement.taken((capacity as i64 - level) as u64, unit, 2 * capacity);
    let state = BucketState {
        level: capacity as i64 - taken as i64,
        updated_ms: now_ms,
        capacity,
    };
    Some((state, ceil_div(taken, per_ms).max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &mut Option<BucketState>, rate: Rate, burst: u64, now: i64) -> Decision {
        let ev = evaluate(rate, burst, state.as_ref(), now, 1);
        if ev.admitted.allowed {
            *state = Some(ev.next);
        }
        ev.admitted
    }

    #[test]
    fn burst_then_refill_at_rate() {
        let rate = Rate::new(5, 1_000).unwrap();
        let mut state = None;
        let admitted = (0..15)
            .filter(|_| run(&mut state, rate, 10, 0).allowed)
            .count();
        assert_eq!(admitted, 10);
        let d = run(&mut state, rate, 10, 0);
        assert_eq!(d.retry_after_ms, 200);
        assert_eq!(d.reset_after_ms, 2_000);
        assert!(!run(&mut state, rate, 10, 199).allowed);
        assert!(run(&mut state, rate, 10, 200).allowed);
    }

    #[test]
    fn fractional_refill_is_never_lost() {
        // 3 per second: one token every 333.33 ms. Polling an emptied bucket every 100 ms must still admit 3 per
        // second: the thirds of a token between polls add up.
        let rate = Rate::new(3, 1_000).unwrap();
        let mut state = None;
        assert_eq!(
            (0..3)
                .filter(|_| run(&mut state, rate, 3, 0).allowed)
                .count(),
            3
        );
        let admitted = (1..=30)
            .filter(|i| run(&mut state, rate, 3, i * 100).allowed)
            .count();
        assert_eq!(admitted, 9);
    }
}
