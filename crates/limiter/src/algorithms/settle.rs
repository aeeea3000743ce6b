//! Settling what an admission took once its request is known: part of it given back or more of it owed.
//!
//! A give-back returns what was taken and not used: a held request whose client went away, one slot's commit of a
//! request that another slot denied, a reservation whose answer spent less. A debt adds what an answer spent past
//! its reservation, even past the limit's maximum, so that later requests wait until it is paid: a window's
//! counter goes over its limit until the window ends, a bucket goes below empty (a GCRA's arrival time moves
//! later, a meter overflows) and takes `amount / rate` longer to refill, a log gets entries at the decision's time.
//!
//! Both are settled on the window the admission was decided in (`at_ms`): a window that has passed since holds
//! nothing of it. A give-back finds nothing to give back to on a key that holds nothing of that window, and never
//! takes a state below empty, so it can never admit more than the limit would have without the admission. A debt
//! on a key forgotten meanwhile (expired once full again) starts from its fresh state, and is carried up to one
//! full capacity beyond the maximum (the state then holds at most twice the capacity): both stores compute exactly
//! below 2^53 and every limit is bounded so that twice its capacity stays there; past it the rest is forgiven, a
//! debt that large already holding the key for a whole window.
//!
//! Each algorithm's `settle` does its arithmetic once for both; `settle` in `scripts/check/3-algorithms.lua`
//! mirrors them integer for integer.

use super::{concurrency, fixed_window, gcra, leaky_bucket, sliding_log, sliding_window};
use super::{token_bucket, State};
use crate::Algorithm;

/// What settling an admission does to its key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Gives back this much of what the admission took.
    GiveBack(u64),
    /// Adds this much to what the admission took, as a debt.
    Debt(u64),
}

/// The state `state` becomes at `now_ms` once `settlement` is applied for an admission decided at `at_ms`, with
/// how long it must be kept (ms); `None` when nothing is to change (the window it landed in has gone by, or a
/// give-back finds nothing of the admission to give back to). A state of another algorithm counts as absent.
#[inline]
pub fn settle(
    algorithm: &Algorithm,
    state: Option<&State>,
    now_ms: i64,
    at_ms: i64,
    settlement: Settlement,
) -> Option<(State, u64)> {
    let (at_ms, settlement) = match settlement {
        // A decision is never later than its settlement; past one capacity beyond the maximum a debt is forgiven.
        Settlement::Debt(amount) => (
            at_ms.min(now_ms),
            Settlement::Debt(amount.min(2 * algorithm.capacity())),
        ),
        Settlement::GiveBack(_) => (at_ms, settlement),
    };
    match *algorithm {
        Algorithm::FixedWindow { limit, period_ms } => {
            let state = typed!(state, FixedWindow);
            fixed_window::settle(limit, period_ms, state, now_ms, at_ms, settlement)
                .map(as_state(State::FixedWindow))
        }
        Algorithm::CalendarWindow { limit, calendar } => {
            let state = typed!(state, FixedWindow);
            let landed = calendar.window_at(at_ms);
            fixed_window::settle_in(limit, landed, state, now_ms, settlement)
                .map(as_state(State::FixedWindow))
        }
        Algorithm::SlidingWindow { limit, period_ms } => {
            let state = typed!(state, Window);
            sliding_window::settle(limit, period_ms, state, now_ms, at_ms, settlement)
                .map(as_state(State::Window))
        }
        Algorithm::SlidingLog { limit, period_ms } => {
            let state = typed!(state, Log);
            sliding_log::settle(limit, period_ms, state, now_ms, at_ms, settlement)
                .map(as_state(State::Log))
        }
        Algorithm::TokenBucket { rate, burst } => {
            let state = typed!(state, Bucket);
            token_bucket::settle(rate, burst, state, now_ms, settlement)
                .map(as_state(State::Bucket))
        }
        Algorithm::Gcra { rate, burst } => {
            let state = typed!(state, Gcra);
            gcra::settle(rate, burst, state, now_ms, settlement).map(as_state(State::Gcra))
        }
        Algorithm::LeakyBucket { rate, burst, mode } => {
            let state = typed!(state, Meter);
            leaky_bucket::settle(rate, burst, mode, state, now_ms, settlement)
                .map(as_state(State::Meter))
        }
        Algorithm::Concurrency { .. } => {
            concurrency::settle(typed!(state, Slots), settlement).map(as_state(State::Slots))
        }
    }
}

// === impl Settlement ===

impl Settlement {
    /// What a key holds taken (a count, or a bucket's scaled units, or ticks: `unit` per request) once settled: a
    /// give-back never takes it below empty, a debt never past `most`.
    pub(super) fn taken(self, taken: u64, unit: u64, most: u64) -> u64 {
        match self {
            Self::GiveBack(amount) => taken.saturating_sub(amount * unit),
            Self::Debt(amount) => (taken + amount * unit).min(most),
        }
    }

    /// The state to settle on a key that holds nothing of the admission's window (no state, or another window's):
    /// none for a give-back, which has nothing to give back to; `fresh` for a debt.
    pub(super) fn or_fresh<T>(self, fresh: T) -> Option<T> {
        match self {
            Self::GiveBack(_) => None,
            Self::Debt(_) => Some(fresh),
        }
    }
}

/// How long to keep a state written at `now_ms` that matters until `until_ms`: at least a millisecond.
pub(super) fn kept_until(until_ms: i64, now_ms: i64) -> u64 {
    (until_ms - now_ms).max(1) as u64
}

/// A settled algorithm's state and its keeping time, as a [`State`].
fn as_state<S>(variant: fn(S) -> State) -> impl Fn((S, u64)) -> (State, u64) {
    move |(state, ttl_ms)| (variant(state), ttl_ms)
}

#[cfg(test)]
mod tests;
