//! `sliding_window`: counts of the current and previous aligned windows, the previous one weighted by how much of
//! it still overlaps the sliding interval (Cloudflare's approximation). O(1) memory per key.

use super::settle::{kept_until, Settlement};
use super::Transition;
use crate::Decision;

/// Counts for the window starting at `window_start_ms` and the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowState {
    /// Start of the current window, a multiple of the period.
    pub window_start_ms: i64,
    /// Admitted cost in the current window.
    pub current: u64,
    /// Admitted cost in the previous window.
    pub previous: u64,
}

/// Evaluates a request of `cost` at `now_ms`.
///
/// All arithmetic is on integers scaled by the period: the estimate `previous × (P − elapsed) / P + current` is
/// compared as `previous × (P − elapsed) + current × P` against `limit × P`, so nothing is rounded.
pub fn evaluate(
    limit: u64,
    period_ms: u64,
    state: Option<&WindowState>,
    now_ms: i64,
    cost: u64,
) -> Transition<WindowState> {
    let p = period_ms as i64;
    let window_start = now_ms - now_ms.rem_euclid(p);
    let elapsed = (now_ms - window_start) as u64;
    let (previous, current) = match state {
        Some(s) if s.window_start_ms == window_start => (s.previous, s.current),
        Some(s) if s.window_start_ms == window_start - p => (s.current, 0),
        _ => (0, 0),
    };
    let left = period_ms - elapsed;
    let used = previous * left + current * period_ms;
    let capacity = limit * period_ms;
    let standing_reset = if current > 0 {
        left + period_ms
    } else if previous > 0 {
        left
    } else {
        0
    };
    let standing_remaining = capacity.saturating_sub(used) / period_ms;

    if used + cost * period_ms <= capacity {
        let admitted = Decision {
            allowed: true,
            limit,
            remaining: (capacity - used - cost * period_ms) / period_ms,
            retry_after_ms: 0,
            reset_after_ms: left + period_ms,
            delay_ms: 0,
            owed: 0,
        };
        let standing = Decision {
            remaining: standing_remaining,
            reset_after_ms: standing_reset,
            ..admitted
        };
        let next = WindowState {
            window_start_ms: window_start,
            current: current + cost,
            previous,
        };
        return Transition {
            admitted,
            standing,
            next,
            ttl_ms: left + period_ms,
        };
    }

    let denied = Decision {
        allowed: false,
        limit,
        remaining: standing_remaining,
        retry_after_ms: retry_after_ms(limit, period_ms, left, (previous, current), cost),
        reset_after_ms: standing_reset,
        delay_ms: 0,
        owed: used.saturating_sub(capacity).div_ceil(period_ms),
    };
    Transition {
        admitted: denied,
        standing: denied,
        next: WindowState {
            window_start_ms: window_start,
            current,
            previous,
        },
        ttl_ms: standing_reset,
    }
}

/// How long a request of `cost` denied with `left` ms of the current window to go waits until the weighted estimate
/// of the counts (`previous`, `current`) leaves room for it.
fn retry_after_ms(
    limit: u64,
    period_ms: u64,
    left: u64,
    (previous, current): (u64, u64),
    cost: u64,
) -> u64 {
    let wait = if current + cost <= limit {
        // Room appears within this window, as the previous window's weight decays.
        left - ((limit - current - cost) * period_ms) / previous
    } else {
        // Only after this window ends, once the current count (then previous) has decayed enough.
        left + period_ms - ((limit - cost) * period_ms) / current
    };
    wait.max(1)
}

/// The counts once `settlement` is applied at `now_ms` to the window `at_ms` fell in, with how long to keep them;
/// `None` once that window is no longer the current or the previous one (see [`Settlement`]).
pub fn settle(
    limit: u64,
    period_ms: u64,
    state: Option<&WindowState>,
    now_ms: i64,
    at_ms: i64,
    settlement: Settlement,
) -> Option<(WindowState, u64)> {
    let period = period_ms as i64;
    let landed = at_ms - at_ms.rem_euclid(period);
    if landed + 2 * period <= now_ms {
        return None;
    }
    let fresh = |previous| WindowState {
        window_start_ms: landed,
        current: 0,
        previous,
    };
    let mut state = match state {
        // The window it landed in, or the next one (where it counts as the previous window).
        Some(s) if s.window_start_ms == landed || s.window_start_ms == landed + period => *s,
        // A debt on a key whose clock ran further ahead goes to its previous window too.
        Some(s) if s.window_start_ms > landed => settlement.or_fresh(*s)?,
        Some(s) if s.window_start_ms == landed - period => settlement.or_fresh(fresh(s.current))?,
        _ => settlement.or_fresh(fresh(0))?,
    };
    let most = 2 * limit;
    if state.window_start_ms == landed {
        state.current = settlement.taken(state.current, 1, most);
    } else {
        state.previous = settlement.taken(state.previous, 1, most);
    }
    Some((
        state,
        kept_until(state.window_start_ms + 2 * period, now_ms),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &mut Option<WindowState>, now: i64) -> Decision {
        let ev = evaluate(10, 1000, state.as_ref(), now, 1);
        if ev.admitted.allowed {
            *state = Some(ev.next);
        }
        ev.admitted
    }

    #[test]
    fn admits_limit_in_one_window_then_denies_until_the_next() {
        let mut state = None;
        for i in 0..10 {
            assert!(run(&mut state, 1_000_000 + i).allowed, "request {i}");
        }
        let denied = run(&mut state, 1_000_010);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 0);
        // At 1_001_000 the previous window weighs 100%: 10 × 1000/1000 = 10, still full. At +100ms it is 9.
        assert_eq!(denied.retry_after_ms, 990 + 100);
        assert!(!run(&mut state, 1_001_099).allowed);
        assert!(run(&mut state, 1_001_100).allowed);
    }

    #[test]
    fn previous_window_weight_decays_linearly() {
        let mut state = None;
        for i in 0..10 {
            run(&mut state, 2_000_000 + i);
        }
        // Halfway through the next window the previous 10 count as 5.
        let mut admitted = 0;
        for _ in 0..10 {
            if run(&mut state, 2_001_500).allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5);
    }

    #[test]
    fn state_older_than_two_windows_is_forgotten() {
        let mut state = None;
        for i in 0..10 {
            run(&mut state, 3_000_000 + i);
        }
        let d = run(&mut state, 3_002_000);
        assert!(d.allowed);
        assert_eq!(d.remaining, 9);
    }
}
