//! The algorithms as pure functions of (state, now, cost): no I/O, no clock, no HTTP.
//!
//! Each function mirrors a section of the Redis script (`scripts/check/`) integer for integer, so that the memory
//! store and the Redis store make the same decision for the same sequence of timestamps.

/// `state` as `State::$variant`'s inner state, or `None` (absent, or another algorithm's).
macro_rules! typed {
    ($state:expr, $variant:ident) => {
        $state.and_then(|s| match s {
            State::$variant(s) => Some(s),
            _ => None,
        })
    };
}

pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
mod settle;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

pub use self::settle::{settle, Settlement};
use super::{Algorithm, Decision, Outcome};

/// The state one key holds, whichever algorithm it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// `fixed_window` counter.
    FixedWindow(fixed_window::FixedWindowState),
    /// `sliding_window` counters.
    Window(sliding_window::WindowState),
    /// `sliding_log` timestamps of admitted requests.
    Log(sliding_log::LogState),
    /// `token_bucket` level.
    Bucket(token_bucket::BucketState),
    /// `gcra` theoretical arrival time.
    Gcra(gcra::GcraState),
    /// `leaky_bucket` water level.
    Meter(token_bucket::BucketState),
    /// `concurrency` slots held.
    Slots(concurrency::SlotsState),
}

/// What an algorithm says about one request, before the store decides whether to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition<S> {
    /// The decision if the request is admitted by every limit (state consumed).
    pub admitted: Decision,
    /// The decision if the request is denied by any limit (nothing consumed). Equal to `admitted` when this
    /// limit itself denies.
    pub standing: Decision,
    /// The state to store if the request is admitted.
    pub next: S,
    /// How long the key must live after committing `next`, in milliseconds.
    pub ttl_ms: u64,
}

/// Evaluates `cost` against `state` at `now_ms`; a state of another algorithm counts as absent.
///
/// A cost above the capacity (a reservation larger than the limit) is never admitted: it is denied with the state
/// as it stands, and a `retry_after` of the limit's whole window (or longer while the key is in debt), since no wait
/// makes it fit.
pub fn evaluate(
    algorithm: &Algorithm,
    state: Option<&State>,
    now_ms: i64,
    cost: u64,
) -> Transition<State> {
    if cost > algorithm.capacity() {
        let mut standing = evaluate(algorithm, state, now_ms, 0);
        let denied = Decision {
            allowed: false,
            retry_after_ms: (algorithm.window_ms_at(now_ms)).max(standing.standing.retry_after_ms),
            delay_ms: 0,
            ..standing.standing
        };
        (standing.admitted, standing.standing) = (denied, denied);
        return standing;
    }
    match *algorithm {
        Algorithm::FixedWindow { limit, period_ms } => {
            let state = typed!(state, FixedWindow);
            fixed_window::evaluate(limit, period_ms, state, now_ms, cost).map(State::FixedWindow)
        }
        Algorithm::CalendarWindow { limit, calendar } => {
            let state = typed!(state, FixedWindow);
            let window = calendar.window_at(now_ms);
            fixed_window::evaluate_calendar(limit, window, state, now_ms, cost)
                .map(State::FixedWindow)
        }
        Algorithm::SlidingWindow { limit, period_ms } => {
            let state = typed!(state, Window);
            sliding_window::evaluate(limit, period_ms, state, now_ms, cost).map(State::Window)
        }
        Algorithm::SlidingLog { limit, period_ms } => {
            let state = typed!(state, Log);
            sliding_log::evaluate(limit, period_ms, state, now_ms, cost).map(State::Log)
        }
        Algorithm::TokenBucket { rate, burst } => {
            let state = typed!(state, Bucket);
            token_bucket::evaluate(rate, burst, state, now_ms, cost).map(State::Bucket)
        }
        Algorithm::Gcra { rate, burst } => {
            let state = typed!(state, Gcra);
            gcra::evaluate(rate, burst, state, now_ms, cost).map(State::Gcra)
        }
        Algorithm::LeakyBucket { rate, burst, mode } => {
            let state = typed!(state, Meter);
            leaky_bucket::evaluate(rate, burst, mode, state, now_ms, cost).map(State::Meter)
        }
        Algorithm::Concurrency { max, .. } => {
            let state = typed!(state, Slots);
            concurrency::evaluate(max, state, cost).map(State::Slots)
        }
    }
}

/// The outcome of one request from the transitions of its limits, in order: admitted only if every limit admits,
/// except that a limit in shadow mode (`is_shadow(i)`) never denies; it consumes only when it admits itself. A
/// denied request consumes from no limit. `commit(i, next, ttl_ms)` stores the state of every limit that consumes.
///
/// The one place the rule lives: the memory store applies it to its map, the Redis store to the runs of identical
/// requests it replays (see `store/script/`), and the Redis script (`scripts/check/`) mirrors it.
///
/// `transitions` is any list of them, taken by value or borrowed (a list kept for the next request, or one on the
/// stack, spares each request an allocation); the decisions go into one allocation of their own, never into the
/// transitions' (which collecting in place would have shrunk with a reallocation).
pub fn combine(
    transitions: impl AsRef<[Transition<State>]>,
    is_shadow: impl Fn(usize) -> bool,
    mut commit: impl FnMut(usize, State, u64),
) -> Outcome {
    let transitions = transitions.as_ref();
    let allowed = transitions
        .iter()
        .enumerate()
        .all(|(i, e)| e.admitted.allowed || is_shadow(i));
    let mut decisions = Vec::with_capacity(transitions.len());
    for (i, ev) in transitions.iter().enumerate() {
        decisions.push(if allowed && ev.admitted.allowed {
            commit(i, ev.next.clone(), ev.ttl_ms);
            ev.admitted
        } else {
            ev.standing
        });
    }
    Outcome {
        allowed,
        decisions,
        batch: 0,
    }
}

impl<S> Transition<S> {
    fn map<T>(self, f: impl FnOnce(S) -> T) -> Transition<T> {
        Transition {
            admitted: self.admitted,
            standing: self.standing,
            next: f(self.next),
            ttl_ms: self.ttl_ms,
        }
    }
}

/// `ceil(a / b)` for non-negative `a` and positive `b`.
fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}
