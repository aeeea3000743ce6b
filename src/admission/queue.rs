//! A request refused only for want of a slot of a `concurrency` limit with `queue:` waits for one, before it is
//! forwarded (holding no upstream connection): in this instance's line for its key, asking again whenever it is
//! first and a slot may have come free, until `max_wait`.

use std::time::Duration;

use tokio::time::Instant;

use super::limits::{Checked, LimitSet, NotChecked, QueuedRefusal};
use super::reserve::Reserve;
use crate::key::RequestFacts;
use crate::limiter::{Place, RateLimiter};

/// How waiting for a slot ended.
pub(super) enum Waited {
    /// A slot was found: the request is admitted by every limit (asked at the instant given, for what is settled
    /// after the answer).
    Admitted(Checked, std::time::Instant),
    /// Refused for good: `max_wait` passed, `max_waiting` requests of the limit wait already, or a limit without a
    /// queue refused it when it asked again.
    Refused(Checked),
    /// The limiter could not decide when the request asked again, and `on_error` refuses.
    Failed(NotChecked),
}

/// Waits for the request `facts` describes, refused as `checked` says for want of the slot `refusal` names.
///
/// Only the first of a key's line asks again: when woken by a release (this instance's, or any instance's through
/// Redis), when it became first, and every third of the limit's lease in case a release went unheard (a slot freed
/// by a lease that ended announces nothing). Each time it asks for all the route's limits at once, as the first
/// time: a rate limit is consumed only by the request that is admitted. A request whose client goes away is
/// dropped here, and its place with it: the next in line is then first.
pub(super) async fn wait_for_slot<R: Reserve>(
    limiter: &RateLimiter,
    limits: &LimitSet,
    facts: &RequestFacts<'_>,
    reserve: R,
    mut checked: Checked,
    mut refusal: QueuedRefusal,
) -> Waited {
    let started = Instant::now();
    let mut deadline = started + Duration::from_millis(refusal.max_wait_ms);
    let Some(mut place) = join(limiter, limits, facts, &refusal) else {
        limits.count_decisions(facts, &checked, None);
        return Waited::Refused(checked);
    };
    // A release heard before this request joined its line woke nobody: the first asks once at once.
    let mut ask_now = place.is_first();
    let waited = loop {
        if !ask_now {
            let first = place.is_first();
            let recheck = Duration::from_millis((refusal.lease_ms / 3).max(1));
            tokio::select! {
                () = place.woken() => {}
                () = tokio::time::sleep(recheck), if first => {}
                () = tokio::time::sleep_until(deadline) => {
                    limits.count_decisions(facts, &checked, None);
                    break Waited::Refused(checked);
                }
            }
            if !place.is_first() {
                continue;
            }
        }
        ask_now = false;
        let asked = std::time::Instant::now();
        checked = match limits.ask_again(limiter, facts, &checked, reserve).await {
            Ok(checked) => checked,
            Err(error) => break Waited::Failed(error),
        };
        if checked.outcome.allowed {
            break Waited::Admitted(checked, asked);
        }
        // Refused by a limit without a queue (a rate limit spent meanwhile): refused now, counted by the check.
        let Some(now_refusing) = limits.queued_refusal(&checked) else {
            break Waited::Refused(checked);
        };
        if now_refusing.index != refusal.index {
            // Another slot is wanting now: the request waits in that key's line, from its end, no longer than either
            // queue lets it (its place in the other line is given up as the new one is taken).
            deadline = deadline.min(started + Duration::from_millis(now_refusing.max_wait_ms));
            refusal = now_refusing;
            place = match join(limiter, limits, facts, &refusal) {
                Some(place) => place,
                None => {
                    limits.count_decisions(facts, &checked, None);
                    break Waited::Refused(checked);
                }
            };
            ask_now = place.is_first();
        }
        if Instant::now() >= deadline {
            limits.count_decisions(facts, &checked, None);
            break Waited::Refused(checked);
        }
    };
    if let Some(histogram) = limits.queue_wait(refusal.index) {
        histogram.record(started.elapsed().as_secs_f64());
    }
    // Leaving the line wakes the next, whichever way this one left.
    drop(place);
    waited
}

/// A place at the end of the line for the key `refusal` names, unless its limit has `max_waiting` requests
/// waiting already (or the key is not the request's, which cannot be).
fn join(
    limiter: &RateLimiter,
    limits: &LimitSet,
    facts: &RequestFacts<'_>,
    refusal: &QueuedRefusal,
) -> Option<Place> {
    let key = limits.key_at(facts, refusal.index)?;
    limiter
        .slot_queues()
        .join(limits.head_at(refusal.index), &key, refusal.max_waiting)
}
