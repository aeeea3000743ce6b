//! Settling on each algorithm: a give-back never below empty, a debt never past its bound, each on the window the
//! admission was decided in, and what the next request is then told.

use super::*;
use crate::algorithms::evaluate;
use crate::algorithms::fixed_window::FixedWindowState;
use crate::algorithms::gcra::EPOCH_MS;
use crate::{LeakyMode, Rate};

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
    let (given, _) =
        settle(&algorithm, state.as_ref(), now, at, Settlement::GiveBack(1)).expect("given back");
    let remaining = |state: Option<&State>| evaluate(&algorithm, state, now, 1).standing.remaining;
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
    assert_eq!(
        settle(&window, Some(&state), 2_500, 1_500, Settlement::GiveBack(1)),
        None
    );
    let (emptied, _) =
        settle(&window, Some(&state), 2_500, 2_100, Settlement::GiveBack(5)).expect("same window");
    assert_eq!(
        emptied,
        State::FixedWindow(FixedWindowState {
            window_start_ms: 2_000,
            count: 0
        })
    );
    assert_eq!(
        settle(&window, None, 2_500, 2_100, Settlement::GiveBack(1)),
        None
    );
}

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
        let (owing, _) = settle(
            &algorithm,
            Some(&state),
            AT + 2_000,
            AT,
            Settlement::Debt(3),
        )
        .expect("owed");
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
        let (refunded, _) = settle(
            &algorithm,
            Some(&state),
            AT + 2_000,
            AT,
            Settlement::GiveBack(6),
        )
        .expect("given back");
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
    assert_eq!(
        settle(&window, Some(&state), AT + 60_000, AT, Settlement::Debt(3)),
        None
    );
    let (owing, _) = settle(
        &window,
        Some(&state),
        AT + 1,
        AT,
        Settlement::Debt(u64::MAX),
    )
    .expect("owed");
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
    let (owing, ttl) = settle(&bucket, None, AT, AT, Settlement::Debt(25)).expect("owed");
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

#[test]
fn nothing_is_given_back_to_a_log_whose_entries_of_that_time_have_left() {
    let log = Algorithm::SlidingLog {
        limit: 10,
        period_ms: 1_000,
    };
    let first = evaluate(&log, None, AT, 10).next;
    // A period and a half later the first ten have left and ten more fill the log.
    let second = evaluate(&log, Some(&first), AT + 1_500, 10);
    assert!(second.admitted.allowed);
    let late = Settlement::GiveBack(10);
    assert_eq!(settle(&log, Some(&second.next), AT + 1_600, AT, late), None);
    let (given, _) = settle(&log, Some(&second.next), AT + 1_600, AT + 1_500, late).expect("given");
    assert!(
        evaluate(&log, Some(&given), AT + 1_600, 10)
            .admitted
            .allowed
    );
}
