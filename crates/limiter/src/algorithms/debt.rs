//! Adding a debt: a request settled for more than it reserved (its answer spent more tokens than the reservation
//! took). Mirrors `add_debt` in `scripts/check/3-algorithms.lua` integer for integer.
//!
//! The difference is added on the key and the window the reservation landed in (`at_ms`, when it was decided),
//! even past the limit's maximum, so that later requests wait until it is paid: a window's counter goes over its
//! limit until the window ends, a bucket goes below empty (a GCRA's arrival time moves later, a meter overflows)
//! and takes `amount / rate` longer to refill, a log gets entries at the decision's time. A window that has passed
//! since takes nothing. A key that was forgotten meanwhile (expired once full again) starts from its fresh state.
//!
//! A debt is carried up to one full capacity beyond the maximum (the state then holds at most twice the capacity):
//! both stores compute exactly below 2^53 and every limit is bounded so that twice its capacity stays there. Past
//! it the rest is forgiven; a debt that large already holds the key for a whole window.

use super::fixed_window::FixedWindowState;
use super::gcra::{GcraState, Ticks, EPOCH_MS};
use super::sliding_window::WindowState;
use super::token_bucket::BucketState;
use super::{ceil_div, State};
use crate::{Algorithm, LeakyMode};

/// The state `state` becomes at `now_ms` once `amount` is added as owed by a request admitted at `at_ms`, with
/// how long it must be kept (ms); `None` when nothing is to change (the window it landed in has gone by).
pub fn add_debt(
    algorithm: &Algorithm,
    state: Option<&State>,
    now_ms: i64,
    at_ms: i64,
    amount: u64,
) -> Option<(State, u64)> {
    let kept_until = |until_ms: i64| (until_ms - now_ms).max(1) as u64;
    // A decision is never later than its settlement.
    let at_ms = at_ms.min(now_ms);
    let most = 2 * algorithm.capacity();
    let owed = amount.min(most);
    match *algorithm {
        Algorithm::FixedWindow { period_ms, .. } => {
            let period = period_ms as i64;
            let landed = at_ms - at_ms.rem_euclid(period);
            if landed + period <= now_ms {
                return None;
            }
            let count = match state {
                Some(State::FixedWindow(s)) if s.window_start_ms == landed => s.count,
                _ => 0,
            };
            let state = FixedWindowState {
                window_start_ms: landed,
                count: (count + owed).min(most),
            };
            Some((State::FixedWindow(state), kept_until(landed + period)))
        }
        Algorithm::SlidingWindow { period_ms, .. } => {
            let period = period_ms as i64;
            let landed = at_ms - at_ms.rem_euclid(period);
            if landed + 2 * period <= now_ms {
                return None;
            }
            let mut state = match state {
                // The window it landed in, or the next one (where it counts as the previous window).
                Some(State::Window(s)) if s.window_start_ms >= landed => *s,
                Some(State::Window(s)) if s.window_start_ms == landed - period => WindowState {
                    window_start_ms: landed,
                    current: 0,
                    previous: s.current,
                },
                _ => WindowState {
                    window_start_ms: landed,
                    current: 0,
                    previous: 0,
                },
            };
            if state.window_start_ms == landed {
                state.current = (state.current + owed).min(most);
            } else {
                state.previous = (state.previous + owed).min(most);
            }
            let ttl = kept_until(state.window_start_ms + 2 * period);
            Some((State::Window(state), ttl))
        }
        Algorithm::SlidingLog { period_ms, .. } => {
            let period = period_ms as i64;
            let mut log = match state {
                Some(State::Log(log)) => log.clone(),
                _ => Default::default(),
            };
            // The key's time never runs backwards (see `sliding_log::evaluate`).
            let now = log.back().map_or(now_ms, |&newest| now_ms.max(newest));
            if at_ms <= now - period {
                return None;
            }
            while log.front().is_some_and(|&t| t <= now - period) {
                log.pop_front();
            }
            let add = owed.min(most.saturating_sub(log.len() as u64));
            // After the entries of the same millisecond, which keeps the log sorted (and, in Redis, numbered).
            let position = log.iter().take_while(|&&t| t <= at_ms).count();
            for _ in 0..add {
                log.insert(position, at_ms);
            }
            Some((State::Log(log), kept_until(now + period)))
        }
        Algorithm::TokenBucket { rate, burst } => {
            let (unit, per_ms) = (rate.period_ms(), rate.count());
            let capacity = burst * unit;
            let level = match state {
                Some(State::Bucket(s)) => s.refilled(capacity, per_ms, now_ms),
                _ => capacity as i64,
            };
            let level = (level - (owed * unit) as i64).max(-(capacity as i64));
            let state = BucketState {
                level,
                updated_ms: now_ms,
                capacity,
            };
            let ttl = ceil_div((capacity as i64 - level) as u64, per_ms).max(1);
            Some((State::Bucket(state), ttl))
        }
        Algorithm::Gcra { rate, burst } => {
            let Ticks {
                ticks_per_ms,
                interval,
            } = Ticks::of(rate);
            let now = (now_ms - EPOCH_MS) * ticks_per_ms as i64;
            let ceiling = now + 2 * (interval * burst) as i64;
            let tat = match state {
                Some(State::Gcra(s)) => s.tat.min(ceiling).max(now),
                _ => now,
            };
            let tat = (tat + (owed * interval) as i64).min(ceiling);
            let ttl = ceil_div((tat - now) as u64, ticks_per_ms).max(1);
            Some((State::Gcra(GcraState { tat }), ttl))
        }
        Algorithm::LeakyBucket { rate, burst, mode } => {
            let (unit, per_ms) = (rate.period_ms(), rate.count());
            let max_delay_ms = match mode {
                LeakyMode::Reject => 0,
                LeakyMode::Delay { max_delay_ms } => max_delay_ms,
            };
            let water = match state {
                Some(State::Meter(s)) => s.drained(burst * unit, max_delay_ms, per_ms, now_ms),
                _ => 0,
            };
            let water = (water + owed * unit).min(2 * burst * unit + max_delay_ms * per_ms);
            let state = BucketState {
                level: water as i64,
                updated_ms: now_ms,
                capacity: 0,
            };
            Some((State::Meter(state), ceil_div(water, per_ms).max(1)))
        }
        // Slots are held and released whole: a request in flight never owes more of them.
        Algorithm::Concurrency { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::{evaluate, give_back};
    use crate::Rate;

    const AT: i64 = EPOCH_MS + 600_000;

    /// Every algorithm at capacity 10, one unit per 6 s (windows of a minute), with the time a request of cost 1
    /// waits once the key is full, and how much longer each unit of debt makes it wait (0: until the window ends).
    fn algorithms() -> Vec<(Algorithm, u64, u64)> {
        let rate = Rate::new(10, 60_000).expect("positive");
        let bucket_wait = 6_000;
        vec![
            // Full at AT (a window's start): until the window ends, debt or not.
            (
                Algorithm::FixedWindow {
                    limit: 10,
                    period_ms: 60_000,
                },
                60_000,
                0,
            ),
            // Entries at AT: until they leave, one period later.
            (
                Algorithm::SlidingLog {
                    limit: 10,
                    period_ms: 60_000,
                },
                60_000,
                0,
            ),
            (
                Algorithm::TokenBucket { rate, burst: 10 },
                bucket_wait,
                6_000,
            ),
            (Algorithm::Gcra { rate, burst: 10 }, bucket_wait, 6_000),
            (
                Algorithm::LeakyBucket {
                    rate,
                    burst: 10,
                    mode: LeakyMode::Reject,
                },
                bucket_wait,
                6_000,
            ),
            (
                Algorithm::LeakyBucket {
                    rate,
                    burst: 10,
                    mode: LeakyMode::Delay {
                        max_delay_ms: 1_000,
                    },
                },
                bucket_wait - 1_000,
                6_000,
            ),
        ]
    }

    /// The state after one reservation of the whole capacity at `AT`.
    fn full(algorithm: &Algorithm) -> State {
        let reserved = evaluate(algorithm, None, AT, 10);
        assert!(reserved.admitted.allowed, "{algorithm:?}");
        reserved.next
    }

    #[test]
    fn a_debt_makes_the_next_request_wait_exactly_its_time() {
        for (algorithm, wait, per_unit) in algorithms() {
            let state = full(&algorithm);
            let next = evaluate(&algorithm, Some(&state), AT + 1, 1).admitted;
            assert_eq!(
                (next.allowed, next.retry_after_ms),
                (false, wait - 1),
                "{algorithm:?} without debt"
            );
            // The answer spent 13: 3 more than reserved, settled 2 s later.
            let (owing, _) = add_debt(&algorithm, Some(&state), AT + 2_000, AT, 3).expect("owed");
            let next = evaluate(&algorithm, Some(&owing), AT + 2_000, 1).admitted;
            assert_eq!(
                (next.allowed, next.retry_after_ms),
                (false, wait + 3 * per_unit - 2_000),
                "{algorithm:?} with a debt of 3"
            );
            // A request of no cost is refused while the key is in debt, and admitted once it is paid.
            let paid = AT + (wait + 3 * per_unit) as i64 - 6_000;
            let free = evaluate(&algorithm, Some(&owing), paid - 1, 0).admitted;
            assert!(!free.allowed || per_unit == 0, "{algorithm:?} {free:?}");
            let later = evaluate(
                &algorithm,
                Some(&owing),
                AT + (wait + 3 * per_unit) as i64,
                1,
            );
            assert!(later.admitted.allowed, "{algorithm:?} once paid");
        }
    }

    #[test]
    fn a_refund_admits_the_next_request() {
        for (algorithm, _, _) in algorithms() {
            let state = full(&algorithm);
            // The answer spent 4 of the 10 reserved: 6 given back.
            let (refunded, _) =
                give_back(&algorithm, Some(&state), AT + 2_000, AT, 6).expect("given back");
            let six = evaluate(&algorithm, Some(&refunded), AT + 2_000, 6);
            assert!(six.admitted.allowed, "{algorithm:?}");
            assert_eq!(six.admitted.delay_ms, 0, "{algorithm:?}");
            let next = evaluate(&algorithm, Some(&six.next), AT + 2_000, 1);
            assert!(
                !next.admitted.allowed,
                "{algorithm:?}: no more than the refund"
            );
        }
    }

    #[test]
    fn a_debt_lands_on_the_window_it_was_taken_from_and_is_carried_to_one_capacity() {
        let window = Algorithm::FixedWindow {
            limit: 10,
            period_ms: 60_000,
        };
        let state = full(&window);
        // Settled after its window ended: the next window owes nothing.
        assert_eq!(add_debt(&window, Some(&state), AT + 60_000, AT, 3), None);
        let (owing, _) = add_debt(&window, Some(&state), AT + 1, AT, u64::MAX).expect("owed");
        assert_eq!(
            owing,
            State::FixedWindow(FixedWindowState {
                window_start_ms: AT,
                count: 20
            })
        );
        let bucket = Algorithm::TokenBucket {
            rate: Rate::new(10, 60_000).expect("positive"),
            burst: 10,
        };
        // A key forgotten since (back to full) owes from full.
        let (owing, ttl) = add_debt(&bucket, None, AT, AT, 25).expect("owed");
        assert_eq!(ttl, 120_000);
        let next = evaluate(&bucket, Some(&owing), AT, 1).admitted;
        assert_eq!(next.retry_after_ms, 66_000);
    }

    #[test]
    fn a_cost_above_the_capacity_is_never_admitted_and_zero_takes_nothing() {
        for (algorithm, _, _) in algorithms() {
            let fresh = evaluate(&algorithm, None, AT, 11).admitted;
            assert!(!fresh.allowed, "{algorithm:?}");
            assert_eq!(fresh.retry_after_ms, 60_000, "{algorithm:?}");
            assert_eq!(fresh.remaining, 10, "{algorithm:?}");
            let zero = evaluate(&algorithm, None, AT, 0);
            assert!(zero.admitted.allowed, "{algorithm:?}");
            assert_eq!(zero.admitted.remaining, 10, "{algorithm:?}");
            let state = full(&algorithm);
            let zero = evaluate(&algorithm, Some(&state), AT, 0).admitted;
            assert!(zero.allowed, "{algorithm:?}: full, not over");
        }
    }
}
