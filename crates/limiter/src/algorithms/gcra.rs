//! `gcra`: the generic cell rate algorithm with redis-cell's `CL.THROTTLE` semantics. `burst: B, rate: N/P`
//! behaves as `CL.THROTTLE key B-1 N P`: a fresh key admits B requests at once, then one every P/N.

use super::settle::Settlement;
use super::{ceil_div, Transition};
use crate::{Decision, Rate};

/// GCRA time is counted in ticks of `1/ticks_per_ms` ms since this epoch (2025-01-01T00:00:00Z), so that the
/// emission interval P/N is a whole number of ticks and no fraction is ever rounded away.
pub const EPOCH_MS: i64 = 1_735_689_600_000;

/// The theoretical arrival time, in ticks since [`EPOCH_MS`]: one integer per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraState {
    /// Theoretical arrival time of the next request.
    pub tat: i64,
}

/// The rate reduced to lowest terms: the emission interval is `interval` ticks of `1/ticks_per_ms` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticks {
    /// Ticks per millisecond (the rate's count divided by gcd(count, period)).
    pub ticks_per_ms: u64,
    /// Emission interval in ticks (the period in ms divided by the same gcd).
    pub interval: u64,
}

impl Ticks {
    /// Reduces `rate` so that its emission interval is a whole number of ticks.
    pub fn of(rate: Rate) -> Self {
        let g = gcd(rate.count(), rate.period_ms());
        Self {
            ticks_per_ms: rate.count() / g,
            interval: rate.period_ms() / g,
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// Evaluates a request of `cost` at `now_ms`.
pub fn evaluate(
    rate: Rate,
    burst: u64,
    state: Option<&GcraState>,
    now_ms: i64,
    cost: u64,
) -> Transition<GcraState> {
    let Ticks {
        ticks_per_ms,
        interval,
    } = Ticks::of(rate);
    let per_ms = ticks_per_ms as i64;
    let now = (now_ms - EPOCH_MS) * per_ms;
    let tolerance = (interval * burst) as i64;
    let increment = (interval * cost) as i64;
    // A TAT beyond `now + 2 × tolerance` (a full bucket and a debt of one more) cannot come from these
    // parameters: it was written under another rate (the config changed). Clamped, the key counts as fully used
    // for two windows at most instead of for years.
    let tat = state.map_or(now, |s| s.tat.min(now + 2 * tolerance));
    let new_tat = tat.max(now) + increment;
    let allow_at = new_tat - tolerance;
    let to_ms = |ticks: i64| ceil_div(ticks.max(0) as u64, ticks_per_ms);
    let remaining = |ttl: i64| ((tolerance - ttl).max(0) as u64) / interval;
    // Past the tolerance the key owes: whole emission intervals, rounded up.
    let owed = |ttl: i64| ((ttl - tolerance).max(0) as u64).div_ceil(interval);

    let standing_ttl = (tat - now).max(0);
    let standing = Decision {
        allowed: true,
        limit: burst,
        remaining: remaining(standing_ttl),
        retry_after_ms: 0,
        reset_after_ms: to_ms(standing_ttl),
        delay_ms: 0,
        owed: owed(standing_ttl),
    };
    if now >= allow_at {
        let ttl = new_tat - now;
        let admitted = Decision {
            remaining: remaining(ttl),
            reset_after_ms: to_ms(ttl),
            ..standing
        };
        return Transition {
            admitted,
            standing,
            next: GcraState { tat: new_tat },
            ttl_ms: to_ms(ttl),
        };
    }
    let denied = Decision {
        allowed: false,
        retry_after_ms: to_ms(allow_at - now),
        ..standing
    };
    Transition {
        admitted: denied,
        standing: denied,
        next: GcraState { tat },
        ttl_ms: to_ms(standing_ttl),
    }
}

/// The theoretical arrival time once `settlement` is applied at `now_ms`, with how long to keep it (see
/// [`Settlement`]): a debt moves it later, up to two tolerances ahead of now.
pub fn settle(
    rate: Rate,
    burst: u64,
    state: Option<&GcraState>,
    now_ms: i64,
    settlement: Settlement,
) -> Option<(GcraState, u64)> {
    let Ticks {
        ticks_per_ms,
        interval,
    } = Ticks::of(rate);
    let now = (now_ms - EPOCH_MS) * ticks_per_ms as i64;
    // How far the TAT is ahead of now (a TAT in the past is now).
    let ahead = match state {
        Some(s) => (s.tat - now).max(0) as u64,
        None => settlement.or_fresh(0)?,
    };
    let ahead = settlement.taken(ahead, interval, 2 * interval * burst);
    let state = GcraState {
        tat: now + ahead as i64,
    };
    Some((state, ceil_div(ahead, ticks_per_ms).max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &mut Option<GcraState>, rate: Rate, burst: u64, now: i64, cost: u64) -> Decision {
        let ev = evaluate(rate, burst, state.as_ref(), now, cost);
        if ev.admitted.allowed {
            *state = Some(ev.next);
        }
        ev.admitted
    }

    #[test]
    fn fresh_key_matches_cl_throttle() {
        // CL.THROTTLE key 15 30 60 on a fresh key: 0 (allowed), 16, 15, -1, 2.
        let rate = Rate::new(30, 60_000).unwrap();
        let d = run(&mut None, rate, 16, EPOCH_MS + 5_000, 1);
        assert_eq!(
            (
                d.allowed,
                d.limit,
                d.remaining,
                d.retry_after_ms,
                d.reset_after_ms
            ),
            (true, 16, 15, 0, 2_000)
        );
    }

    #[test]
    fn burst_then_one_per_emission_interval() {
        let rate = Rate::new(30, 60_000).unwrap();
        let t0 = EPOCH_MS + 1_000_000;
        let mut state = None;
        let admitted = (0..20)
            .filter(|_| run(&mut state, rate, 16, t0, 1).allowed)
            .count();
        assert_eq!(admitted, 16);
        let d = run(&mut state, rate, 16, t0, 1);
        assert_eq!(
            (d.remaining, d.retry_after_ms, d.reset_after_ms),
            (0, 2_000, 32_000)
        );
        assert!(!run(&mut state, rate, 16, t0 + 1_999, 1).allowed);
        assert!(run(&mut state, rate, 16, t0 + 2_000, 1).allowed);
    }

    #[test]
    fn fractional_intervals_are_exact() {
        // 3 per second: an interval of 333⅓ ms. Polled every millisecond after the burst is spent, exactly 90
        // requests pass in 30 s: the thirds of a millisecond are never rounded away.
        let rate = Rate::new(3, 1_000).unwrap();
        let t0 = EPOCH_MS;
        let mut state = None;
        assert_eq!(
            (0..3)
                .filter(|_| run(&mut state, rate, 3, t0, 1).allowed)
                .count(),
            3
        );
        let admitted = (1..=30_000)
            .filter(|ms| run(&mut state, rate, 3, t0 + ms, 1).allowed)
            .count();
        assert_eq!(admitted, 90);
    }

    #[test]
    fn state_from_another_rate_is_bounded_by_this_rate() {
        let t0 = EPOCH_MS + 1_000_000;
        let mut state = None;
        run(&mut state, Rate::new(3, 1_000).unwrap(), 3, t0, 1);
        let slower = Rate::new(1_000, 3_600_000).unwrap();
        let d = run(&mut state, slower, 10, t0, 1);
        assert!(d.retry_after_ms <= 36_000 + 3_600, "{d:?}");
        assert!(d.reset_after_ms <= 72_000, "{d:?}");
    }

    #[test]
    fn denied_cost_reports_what_remains() {
        let rate = Rate::new(1, 1_000).unwrap();
        let mut state = None;
        let t0 = EPOCH_MS;
        assert!(run(&mut state, rate, 10, t0, 7).allowed);
        let d = run(&mut state, rate, 10, t0, 5);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 3);
        assert_eq!(d.retry_after_ms, 2_000);
    }
}
