//! `sliding_log`: the exact algorithm. Keeps the timestamp of every admitted unit of cost for one period, so at
//! most `limit` are admitted in any interval of `period` milliseconds.

use imbl::Vector;

use super::settle::{kept_until, Settlement};
use super::Transition;
use crate::Decision;

/// Timestamps (ms) of admitted units of cost, oldest first, none older than one period. A persistent vector: an
/// evaluation starts from the stored log in O(1) and its changes at both ends copy a chunk or two, not the whole
/// log (up to 100,000 entries), which the store keeps if the request is admitted.
pub type LogState = Vector<i64>;

/// Evaluates a request of `cost` at `now_ms`.
///
/// Time never runs backwards for a key: a `now_ms` older than the newest entry is taken as that entry's time, as
/// the Redis script does, which keeps the log sorted.
pub fn evaluate(
    limit: u64,
    period_ms: u64,
    state: Option<&LogState>,
    now_ms: i64,
    cost: u64,
) -> Transition<LogState> {
    let period = period_ms as i64;
    let mut log: LogState = state.cloned().unwrap_or_default();
    let now = log.back().map_or(now_ms, |&newest| now_ms.max(newest));
    // The interval is (now − period, now]: an entry exactly one period old has left it.
    while log.front().is_some_and(|&t| t <= now - period) {
        log.pop_front();
    }
    let count = log.len() as u64;
    let standing_reset = log
        .back()
        .map_or(0, |&newest| (newest + period - now) as u64);

    if count + cost <= limit {
        let admitted = Decision {
            allowed: true,
            limit,
            remaining: limit - count - cost,
            retry_after_ms: 0,
            reset_after_ms: period_ms,
            delay_ms: 0,
            owed: 0,
        };
        let standing = Decision {
            remaining: limit - count,
            reset_after_ms: standing_reset,
            ..admitted
        };
        log.extend(std::iter::repeat_n(now, cost as usize));
        return Transition {
            admitted,
            standing,
            next: log,
            // The log's time may be ahead of `now_ms` (clamped above): it expires one period after that.
            ttl_ms: period_ms + (now - now_ms) as u64,
        };
    }

    // Denied: wait until enough of the oldest entries leave the interval for `cost` to fit.
    let must_leave = (count + cost - limit) as usize;
    let retry_after_ms = log
        .get(must_leave - 1)
        .map_or(period_ms, |&t| (t + period - now) as u64);
    let denied = Decision {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(count),
        retry_after_ms,
        reset_after_ms: standing_reset,
        delay_ms: 0,
        owed: count.saturating_sub(limit),
    };
    Transition {
        admitted: denied,
        standing: denied,
        next: log,
        ttl_ms: standing_reset,
    }
}

/// The log once `settlement` is applied at `now_ms` for an admission decided at `at_ms`, with how long to keep it;
/// `None` once entries of that time have left the interval (see [`Settlement`]).
///
/// A give-back removes the oldest entries from `at_ms` on. `at_ms` is never later than the decision (one worked out
/// from this process's clock may be a little earlier): they are the decision's own, or others' from a moment
/// before it, which leaves the log no emptier than removing the decision's would. Entries at one millisecond are
/// alike (the script removes the highest-numbered members of each, which keeps its numbering unbroken). A debt
/// adds entries at `at_ms`.
pub fn settle(
    limit: u64,
    period_ms: u64,
    state: Option<&LogState>,
    now_ms: i64,
    at_ms: i64,
    settlement: Settlement,
) -> Option<(LogState, u64)> {
    let period = period_ms as i64;
    let mut log = match state {
        Some(log) => log.clone(),
        None => settlement.or_fresh(LogState::default())?,
    };
    // The key's time never runs backwards (see `evaluate`).
    let now = log.back().map_or(now_ms, |&newest| now_ms.max(newest));
    if at_ms <= now - period {
        return None;
    }
    if let Settlement::GiveBack(mut to_remove) = settlement {
        log.retain(|&t| {
            let remove = t >= at_ms && to_remove > 0;
            to_remove -= u64::from(remove);
            !remove
        });
        let ttl = log
            .back()
            .map_or(1, |&newest| kept_until(newest + period, now_ms));
        return Some((log, ttl));
    }
    while log.front().is_some_and(|&t| t <= now - period) {
        log.pop_front();
    }
    let held = log.len() as u64;
    let add = settlement.taken(held, 1, 2 * limit).saturating_sub(held);
    // After the entries of the same millisecond, which keeps the log sorted (and, in Redis, numbered).
    let position = log.iter().take_while(|&&t| t <= at_ms).count();
    for _ in 0..add {
        log.insert(position, at_ms);
    }
    Some((log, kept_until(now + period, now_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &mut Option<LogState>, now: i64, cost: u64) -> Decision {
        let ev = evaluate(5, 60_000, state.as_ref(), now, cost);
        if ev.admitted.allowed {
            *state = Some(ev.next);
        }
        ev.admitted
    }

    #[test]
    fn admits_exactly_limit_in_the_same_millisecond() {
        let mut state = None;
        let admitted = (0..20)
            .filter(|_| run(&mut state, 1_000, 1).allowed)
            .count();
        assert_eq!(admitted, 5);
    }

    #[test]
    fn retry_after_points_at_the_oldest_entry_leaving() {
        let mut state = None;
        for i in 0..5 {
            run(&mut state, 1_000 + i * 1_000, 1);
        }
        let d = run(&mut state, 10_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms, 1_000 + 60_000 - 10_000);
        assert_eq!(d.reset_after_ms, 5_000 + 60_000 - 10_000);
        // A cost of 3 must wait for three entries to leave.
        let d = run(&mut state, 10_000, 3);
        assert_eq!(d.retry_after_ms, 3_000 + 60_000 - 10_000);
        assert!(run(&mut state, 61_000, 1).allowed);
    }

    #[test]
    fn exact_in_any_interval() {
        let mut state = None;
        let mut admitted = Vec::new();
        for now in (0..200_000).step_by(700) {
            if run(&mut state, now, 1).allowed {
                admitted.push(now);
            }
        }
        for (i, &start) in admitted.iter().enumerate() {
            let within = admitted[i..]
                .iter()
                .take_while(|&&t| t < start + 60_000)
                .count();
            assert!(within <= 5, "{within} admitted in [{start}, {start}+60s)");
        }
    }
}
