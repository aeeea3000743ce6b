//! `leaky_bucket`: a meter of capacity `burst` leaking at `rate`. In `reject` mode a request that would overflow
//! the meter is refused; in `delay` mode it is admitted late, once it conforms (nginx `limit_req` without
//! `nodelay`), unless that is more than `max_delay` away.

use super::settle::Settlement;
use super::token_bucket::BucketState;
use super::{ceil_div, Transition};
use crate::{Decision, Rate};

/// What happens to a request that does not fit the meter now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeakyMode {
    /// Refuse it.
    Reject,
    /// Hold it until it conforms, if that is at most `max_delay_ms` away; refuse it otherwise.
    Delay {
        /// The longest a request may be held.
        max_delay_ms: u64,
    },
}

/// Evaluates a request of `cost` at `now_ms`.
///
/// The meter's water is counted in the token bucket's scaled units (one request is `rate.period_ms` units, and
/// `rate.count` units leak per ms), and stored as [`BucketState`] with `level` = water. In delay mode the water
/// may exceed the capacity by what the held requests add: each held request raises the next one's delay by one
/// emission interval, which is what releases held requests at the configured rate.
pub fn evaluate(
    rate: Rate,
    burst: u64,
    mode: LeakyMode,
    state: Option<&BucketState>,
    now_ms: i64,
    cost: u64,
) -> Transition<BucketState> {
    let unit = rate.period_ms();
    let per_ms = rate.count();
    let capacity = burst * unit;
    let max_delay_ms = mode.max_delay_ms();
    let water = state.map_or(0, |s| s.drained(capacity, max_delay_ms, per_ms, now_ms));
    let need = cost * unit;
    let room = |water: u64| capacity.saturating_sub(water) / unit;
    // Past the capacity (held requests in delay mode, or a debt) the meter owes whole requests, rounded up.
    let owed = |water: u64| water.saturating_sub(capacity).div_ceil(unit);
    let standing = Decision {
        allowed: true,
        limit: burst,
        remaining: room(water),
        retry_after_ms: 0,
        reset_after_ms: ceil_div(water, per_ms),
        delay_ms: 0,
        owed: owed(water),
    };
    // How long until the meter has room for `need`.
    let wait = ceil_div((water + need).saturating_sub(capacity), per_ms);
    if wait <= max_delay_ms {
        let after = water + need;
        let reset = ceil_div(after, per_ms);
        let admitted = Decision {
            remaining: room(after),
            reset_after_ms: reset,
            delay_ms: wait,
            owed: owed(after),
            ..standing
        };
        return Transition {
            admitted,
            standing,
            next: BucketState {
                level: after as i64,
                updated_ms: now_ms,
                capacity: 0,
            },
            ttl_ms: reset,
        };
    }
    let denied = Decision {
        allowed: false,
        retry_after_ms: wait - max_delay_ms,
        ..standing
    };
    Transition {
        admitted: denied,
        standing: denied,
        next: BucketState {
            level: water as i64,
            updated_ms: now_ms,
            capacity: 0,
        },
        ttl_ms: standing.reset_after_ms,
    }
}

/// The meter once `settlement` is applied at `now_ms`, with how long to keep it (see [`Settlement`]): a debt
/// overflows it, up to the most it can hold.
pub fn settle(
    rate: Rate,
    burst: u64,
    mode: LeakyMode,
    state: Option<&BucketState>,
    now_ms: i64,
    settlement: Settlement,
) -> Option<(BucketState, u64)> {
    let (unit, per_ms) = (rate.period_ms(), rate.count());
    let capacity = burst * unit;
    let max_delay_ms = mode.max_delay_ms();
    let water = match state {
        Some(s) => s.drained(capacity, max_delay_ms, per_ms, now_ms),
        None => settlement.or_fresh(0)?,
    };
    let water = settlement.taken(water, unit, 2 * capacity + max_delay_ms * per_ms);
    let state = BucketState {
        level: water as i64,
        updated_ms: now_ms,
        capacity: 0,
    };
    Some((state, ceil_div(water, per_ms).max(1)))
}

// === impl LeakyMode ===

impl LeakyMode {
    /// The longest a request may be held: 0 in `reject` mode.
    pub fn max_delay_ms(self) -> u64 {
        match self {
            LeakyMode::Reject => 0,
            LeakyMode::Delay { max_delay_ms } => max_delay_ms,
        }
    }
}

// === impl BucketState ===

impl BucketState {
    /// A `leaky_bucket` meter's water at `now_ms`. More than the parameters can hold (the most held requests add,
    /// plus a debt of one capacity) was written under others (the config changed): clamped, so the key waits
    /// two windows at most.
    pub(super) fn drained(
        &self,
        capacity: u64,
        max_delay_ms: u64,
        per_ms: u64,
        now_ms: i64,
    ) -> u64 {
        let most = 2 * capacity + max_delay_ms * per_ms;
        let elapsed = (now_ms - self.updated_ms).max(0) as u64;
        (self.level.max(0) as u64)
            .min(most)
            .saturating_sub(elapsed.saturating_mul(per_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &mut Option<BucketState>, mode: LeakyMode, now: i64) -> Decision {
        let rate = Rate::new(10, 1_000).unwrap();
        let ev = evaluate(rate, 5, mode, state.as_ref(), now, 1);
        if ev.admitted.allowed {
            *state = Some(ev.next);
        }
        ev.admitted
    }

    #[test]
    fn reject_mode_admits_the_capacity_then_the_rate() {
        let mut state = None;
        let admitted = (0..10)
            .filter(|_| run(&mut state, LeakyMode::Reject, 0).allowed)
            .count();
        assert_eq!(admitted, 5);
        let d = run(&mut state, LeakyMode::Reject, 0);
        assert_eq!((d.retry_after_ms, d.reset_after_ms), (100, 500));
        assert!(run(&mut state, LeakyMode::Reject, 100).allowed);
    }

    #[test]
    fn delay_mode_spaces_held_requests_at_the_rate() {
        let mode = LeakyMode::Delay { max_delay_ms: 300 };
        let mut state = None;
        let delays: Vec<Option<u64>> = (0..10)
            .map(|_| {
                let d = run(&mut state, mode, 0);
                d.allowed.then_some(d.delay_ms)
            })
            .collect();
        // 5 fit at once, the next 3 are released 100 ms apart, the rest would wait more than 300 ms.
        assert_eq!(
            delays,
            [
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                Some(100),
                Some(200),
                Some(300),
                None,
                None
            ]
        );
        let d = run(&mut state, mode, 0);
        assert_eq!(d.retry_after_ms, 100);
    }
}
