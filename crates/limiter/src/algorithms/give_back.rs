//! Giving back what an admission took: a held request whose client went away, or one slot's commit of a request
//! that another slot denied. Mirrors `give_back` in `scripts/check/3-algorithms.lua` integer for integer.
//!
//! What was taken is given back on the window it was taken from (`at_ms`, when the admission was decided): a
//! window that has passed since holds nothing of it. No state goes below empty or above full, so a give-back can
//! never admit more than the limit would have without the admission.

use super::fixed_window::FixedWindowState;
use super::gcra::{GcraState, Ticks, EPOCH_MS};
use super::sliding_window::WindowState;
use super::token_bucket::BucketState;
use super::{ceil_div, State};
use crate::{Algorithm, LeakyMode};

/// The state `state` becomes at `now_ms` once `cost` admitted at `at_ms` is given back, with how long it must be
/// kept (ms); `None` when there is nothing to give back to (no state, another algorithm's, a window gone by).
pub fn give_back(
    algorithm: &Algorithm,
    state: Option<&State>,
    now_ms: i64,
    at_ms: i64,
    cost: u64,
) -> Option<(State, u64)> {
    let kept_until = |until_ms: i64| (until_ms - now_ms).max(1) as u64;
    match (*algorithm, state?) {
        (Algorithm::FixedWindow { period_ms, .. }, State::FixedWindow(s)) => {
            let period = period_ms as i64;
            (s.window_start_ms == at_ms - at_ms.rem_euclid(period)).then(|| {
                let state = FixedWindowState {
                    count: s.count.saturating_sub(cost),
                    ..*s
                };
                (
                    State::FixedWindow(state),
                    kept_until(s.window_start_ms + period),
                )
            })
        }
        (Algorithm::SlidingWindow { period_ms, .. }, State::Window(s)) => {
            let period = period_ms as i64;
            let landed = at_ms - at_ms.rem_euclid(period);
            let state = if s.window_start_ms == landed {
                WindowState {
                    current: s.current.saturating_sub(cost),
                    ..*s
                }
            } else if s.window_start_ms == landed + period {
                WindowState {
                    previous: s.previous.saturating_sub(cost),
                    ..*s
                }
            } else {
                return None;
            };
            Some((
                State::Window(state),
                kept_until(s.window_start_ms + 2 * period),
            ))
        }
        (Algorithm::SlidingLog { period_ms, .. }, State::Log(log)) => {
            // `at_ms` is never later than the decision (one worked out from this process's clock may be a little
            // earlier): the oldest `cost` entries from `at_ms` on go, the decision's own or others' from a moment
            // before it, which leaves the log no emptier than removing the decision's would. Entries at one
            // millisecond are alike (the script removes the highest-numbered members of each, which keeps its
            // numbering unbroken).
            let mut log = log.clone();
            let mut to_remove = cost;
            log.retain(|&t| {
                let remove = t >= at_ms && to_remove > 0;
                to_remove -= u64::from(remove);
                !remove
            });
            let ttl = log
                .back()
                .map_or(1, |&newest| kept_until(newest + period_ms as i64));
            Some((State::Log(log), ttl))
        }
        (Algorithm::TokenBucket { rate, burst }, State::Bucket(s)) => {
            let (unit, per_ms) = (rate.period_ms(), rate.count());
            let capacity = burst * unit;
            let level =
                (s.refilled(capacity, per_ms, now_ms) + (cost * unit) as i64).min(capacity as i64);
            let state = BucketState {
                level,
                updated_ms: now_ms,
                capacity,
            };
            Some((
                State::Bucket(state),
                ceil_div((capacity as i64 - level) as u64, per_ms).max(1),
            ))
        }
        (Algorithm::Gcra { rate, .. }, State::Gcra(s)) => {
            let Ticks {
                ticks_per_ms,
                interval,
            } = Ticks::of(rate);
            let now = (now_ms - EPOCH_MS) * ticks_per_ms as i64;
            let tat = (s.tat - (interval * cost) as i64).max(now);
            let ttl = ceil_div((tat - now) as u64, ticks_per_ms).max(1);
            Some((State::Gcra(GcraState { tat }), ttl))
        }
        (Algorithm::LeakyBucket { rate, burst, mode }, State::Meter(s)) => {
            let (unit, per_ms) = (rate.period_ms(), rate.count());
            let max_delay_ms = match mode {
                LeakyMode::Reject => 0,
                LeakyMode::Delay { max_delay_ms } => max_delay_ms,
            };
            let water = s
                .drained(burst * unit, max_delay_ms, per_ms, now_ms)
                .saturating_sub(cost * unit);
            let state = BucketState {
                level: water as i64,
                updated_ms: now_ms,
                capacity: 0,
            };
            Some((State::Meter(state), ceil_div(water, per_ms).max(1)))
        }
        // A slot is released whenever its request ends: it belongs to no window.
        (Algorithm::Concurrency { .. }, State::Slots(s)) => {
            let (state, ttl) = super::concurrency::release(s, cost);
            Some((State::Slots(state), ttl))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::evaluate;
    use crate::Rate;

    /// Admits `n` requests of cost 1 at `at`, gives one back at `now`: the state then decides as if only n - 1
    /// had been admitted.
    fn after_giving_one_back(algorithm: Algorithm, n: u64, at: i64, now: i64) -> (u64, u64) {
        let mut state = None;
        let mut fewer = None;
        for i in 0..n {
            let evaluation = evaluate(&algorithm, state.as_ref(), at, 1);
            assert!(evaluation.admitted.allowed, "admission {i}");
            if i + 1 < n {
                fewer = Some(evaluation.next.clone());
            }
            state = Some(evaluation.next);
        }
        let (given, _) = give_back(&algorithm, state.as_ref(), now, at, 1).expect("given back");
        let remaining =
            |state: Option<&State>| evaluate(&algorithm, state, now, 1).standing.remaining;
        (remaining(Some(&given)), remaining(fewer.as_ref()))
    }

    #[test]
    fn a_give_back_leaves_the_state_one_admission_fewer_would_have() {
        let rate = Rate::new(10, 60_000).expect("positive");
        let at = EPOCH_MS + 1_000_000;
        for algorithm in [
            Algorithm::FixedWindow {
                limit: 10,
                period_ms: 60_000,
            },
            Algorithm::SlidingWindow {
                limit: 10,
                period_ms: 60_000,
            },
            Algorithm::SlidingLog {
                limit: 10,
                period_ms: 60_000,
            },
            Algorithm::TokenBucket { rate, burst: 10 },
            Algorithm::Gcra { rate, burst: 10 },
            Algorithm::LeakyBucket {
                rate,
                burst: 10,
                mode: LeakyMode::Delay { max_delay_ms: 500 },
            },
            Algorithm::Concurrency {
                max: 10,
                lease_ms: 30_000,
                queue: None,
            },
        ] {
            for later in [0, 7] {
                let (given, fewer) = after_giving_one_back(algorithm, 4, at, at + later);
                assert_eq!(given, fewer, "{algorithm:?} {later} ms later");
            }
        }
    }

    #[test]
    fn nothing_is_given_back_to_a_window_gone_by_or_below_empty() {
        let window = Algorithm::FixedWindow {
            limit: 10,
            period_ms: 1_000,
        };
        let state = State::FixedWindow(FixedWindowState {
            window_start_ms: 2_000,
            count: 1,
        });
        assert_eq!(give_back(&window, Some(&state), 2_500, 1_500, 1), None);
        let (emptied, _) = give_back(&window, Some(&state), 2_500, 2_100, 5).expect("same window");
        assert_eq!(
            emptied,
            State::FixedWindow(FixedWindowState {
                window_start_ms: 2_000,
                count: 0
            })
        );
        assert_eq!(give_back(&window, None, 2_500, 2_100, 1), None);
    }
}
