//! `concurrency`: slots held by requests in flight, taken when a request is admitted and given back when its
//! answer ends. In this process a key's state is the number of slots held; Redis keeps a lease per request instead
//! (`scripts/check/3-algorithms.lua`), so that the slots of an instance that died come back.

use super::settle::Settlement;
use super::Transition;
use crate::{Decision, SLOT_RETRY_MS};

/// How long an in-process key holding slots is kept: as long as they are held, which only their release ends (the
/// process that holds them is the one that releases them). Far beyond any request, and exact in an `i64` of ms.
pub const HELD_TTL_MS: u64 = 365 * 86_400_000;

/// The slots of one key held by requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotsState {
    /// Slots held (each request holds its cost).
    pub held: u64,
}

/// Evaluates a request taking `cost` slots of `max`.
pub fn evaluate(max: u64, state: Option<&SlotsState>, cost: u64) -> Transition<SlotsState> {
    let held = state.map_or(0, |s| s.held);
    let wait = |held: u64| if held > 0 { SLOT_RETRY_MS } else { 0 };
    let standing = Decision {
        allowed: held + cost <= max,
        limit: max,
        remaining: max.saturating_sub(held),
        retry_after_ms: if held + cost <= max { 0 } else { SLOT_RETRY_MS },
        reset_after_ms: wait(held),
        delay_ms: 0,
        owed: 0,
    };
    if !standing.allowed {
        return Transition {
            admitted: standing,
            standing,
            next: SlotsState { held },
            ttl_ms: HELD_TTL_MS,
        };
    }
    Transition {
        admitted: Decision {
            remaining: max - held - cost,
            reset_after_ms: SLOT_RETRY_MS,
            ..standing
        },
        standing,
        next: SlotsState { held: held + cost },
        ttl_ms: HELD_TTL_MS,
    }
}

/// The state once `settlement` is applied, with how long to keep it: a give-back releases slots (they belong to no
/// window), kept until released or a moment when none is held (a key back to empty is no state at all); a
/// request in flight never owes more of them, since slots are held and released whole.
pub fn settle(state: Option<&SlotsState>, settlement: Settlement) -> Option<(SlotsState, u64)> {
    let Settlement::GiveBack(cost) = settlement else {
        return None;
    };
    let held = state?.held.saturating_sub(cost);
    Some((SlotsState { held }, if held > 0 { HELD_TTL_MS } else { 1 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(state: &SlotsState, cost: u64) -> (SlotsState, u64) {
        settle(Some(state), Settlement::GiveBack(cost)).expect("released")
    }

    #[test]
    fn admits_until_every_slot_is_held_and_again_once_one_is_released() {
        let mut state = None;
        for expected in [2, 1, 0] {
            let t = evaluate(3, state.as_ref(), 1);
            assert!(t.admitted.allowed);
            assert_eq!(t.admitted.remaining, expected);
            state = Some(t.next);
        }
        let full = evaluate(3, state.as_ref(), 1);
        assert!(!full.admitted.allowed);
        assert_eq!(full.standing.retry_after_ms, SLOT_RETRY_MS);
        assert_eq!(full.next, SlotsState { held: 3 });
        let (released, _) = release(&full.next, 1);
        assert!(evaluate(3, Some(&released), 1).admitted.allowed);
    }

    #[test]
    fn a_key_with_no_slot_held_is_kept_only_a_moment() {
        let (state, ttl) = release(&SlotsState { held: 1 }, 1);
        assert_eq!((state.held, ttl), (0, 1));
        let (state, ttl) = release(&SlotsState { held: 0 }, 1);
        assert_eq!((state.held, ttl), (0, 1), "never below empty");
        assert_eq!(release(&SlotsState { held: 2 }, 1).1, HELD_TTL_MS);
        let held = SlotsState { held: 1 };
        assert_eq!(
            settle(Some(&held), Settlement::Debt(1)),
            None,
            "owes no slot"
        );
        assert_eq!(settle(None, Settlement::GiveBack(1)), None);
    }
}
