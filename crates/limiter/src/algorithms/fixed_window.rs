//! `fixed_window`: a counter per aligned window (`now − now mod period`, or a calendar's), reset when it ends.

use super::settle::{kept_until, Settlement};
use super::Transition;
use crate::{CalendarWindow, Decision};

/// The count of the window starting at `window_start_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Start of the counted window: a multiple of the period, or a boundary of the calendar.
    pub window_start_ms: i64,
    /// Admitted cost in that window.
    pub count: u64,
}

/// Evaluates a request of `cost` at `now_ms`.
///
/// The window start is stored with the count (rather than relying on the key's expiry alone), so that a late
/// expiry can never let an old count leak into the next window.
pub fn evaluate(
    limit: u64,
    period_ms: u64,
    state: Option<&FixedWindowState>,
    now_ms: i64,
    cost: u64,
) -> Transition<FixedWindowState> {
    let window_start = now_ms - now_ms.rem_euclid(period_ms as i64);
    let left = period_ms - (now_ms - window_start) as u64;
    in_window(limit, window_start, left, state, cost)
}

/// Evaluates a request of `cost` in the window `window` of a calendar, at `now_ms` inside it.
pub fn evaluate_calendar(
    limit: u64,
    window: CalendarWindow,
    state: Option<&FixedWindowState>,
    now_ms: i64,
    cost: u64,
) -> Transition<FixedWindowState> {
    // At least a millisecond: a window is never asked about past its end, and an expiry of 0 would keep the key.
    let left = window.left_ms(now_ms).max(1);
    in_window(limit, window.start_ms, left, state, cost)
}

/// Evaluates a request of `cost` in the window starting at `window_start`, `left` ms before it ends.
#[inline]
fn in_window(
    limit: u64,
    window_start: i64,
    left: u64,
    state: Option<&FixedWindowState>,
    cost: u64,
) -> Transition<FixedWindowState> {
    let count = match state {
        Some(s) if s.window_start_ms == window_start => s.count,
        _ => 0,
    };
    let standing_reset = if count > 0 { left } else { 0 };
    if count + cost <= limit {
        let admitted = Decision {
            allowed: true,
            limit,
            remaining: limit - count - cost,
            retry_after_ms: 0,
            reset_after_ms: left,
            delay_ms: 0,
            owed: 0,
        };
        return Transition {
            admitted,
            standing: Decision {
                remaining: limit - count,
                reset_after_ms: standing_reset,
                ..admitted
            },
            next: FixedWindowState {
                window_start_ms: window_start,
                count: count + cost,
            },
            ttl_ms: left,
        };
    }
    let denied = Decision {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(count),
        // The next window starts empty and `cost <= limit`.
        retry_after_ms: left,
        reset_after_ms: standing_reset,
        delay_ms: 0,
        owed: count.saturating_sub(limit),
    };
    Transition {
        admitted: denied,
        standing: denied,
        next: FixedWindowState {
            window_start_ms: window_start,
            count,
        },
        ttl_ms: standing_reset,
    }
}

/// The count of the window `at_ms` fell in once `settlement` is applied at `now_ms`, with how long to keep it; `None`
/// once that window has ended (see [`Settlement`]).
pub fn settle(
    limit: u64,
    period_ms: u64,
    state: Option<&FixedWindowState>,
    now_ms: i64,
    at_ms: i64,
    settlement: Settlement,
) -> Option<(FixedWindowState, u64)> {
    let period = period_ms as i64;
    let landed = at_ms - at_ms.rem_euclid(period);
    settle_in(
        limit,
        CalendarWindow {
            start_ms: landed,
            end_ms: landed + period,
        },
        state,
        now_ms,
        settlement,
    )
}

/// [`settle`] for an admission decided in `landed`, a window of a calendar or of a period.
pub fn settle_in(
    limit: u64,
    landed: CalendarWindow,
    state: Option<&FixedWindowState>,
    now_ms: i64,
    settlement: Settlement,
) -> Option<(FixedWindowState, u64)> {
    let CalendarWindow {
        start_ms: landed,
        end_ms,
    } = landed;
    if end_ms <= now_ms {
        return None;
    }
    let count = match state {
        Some(s) if s.window_start_ms == landed => s.count,
        _ => settlement.or_fresh(0)?,
    };
    let state = FixedWindowState {
        window_start_ms: landed,
        count: settlement.taken(count, 1, 2 * limit),
    };
    Some((state, kept_until(end_ms, now_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_aligned_to_the_period() {
        let mut state = None;
        let mut admitted = 0;
        // 1_000_900 is 100 ms before the window [1_001_000, 1_002_000) begins.
        for now in [
            1_000_900, 1_000_950, 1_000_999, 1_001_000, 1_001_001, 1_001_500,
        ] {
            let ev = evaluate(2, 1_000, state.as_ref(), now, 1);
            if ev.admitted.allowed {
                admitted += 1;
                state = Some(ev.next);
            } else {
                let next_window = now - now % 1_000 + 1_000;
                assert_eq!(ev.admitted.retry_after_ms, (next_window - now) as u64);
            }
        }
        assert_eq!(admitted, 4);
    }
}
