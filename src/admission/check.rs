//! Check: one limiter call for every limit that applies to the request (the route's, the caller's plan's, at what
//! it reserves; or the limits Envoy's descriptors meet), a wait where only a queued slot is wanting, and the refusal
//! when the limits say no or the limiter cannot decide.

use std::future::Future;
use std::pin::Pin;
use std::time::{Instant, SystemTime};

use super::limits::{Checked, LimitRequest, LimitSet, NotChecked};
use super::queue::{wait_for_slot, Waited};
use super::refusal::Refusal;
use super::reserve::Reserve;
use crate::key::RequestFacts;
use crate::limiter::store::LimitCheck;
use crate::limiter::{DecidedBy, RateLimiter};
use crate::trail::{LimiterCall, Trail};

/// Checks `request` against `limits` (a caller on `plan` is refused in its plan's name), waiting for a slot where
/// the limits queue: the decision, with the moment before it when work is settled after the answer (the
/// give-backs then land on its windows, a time never later than the decision's, see `StatusSettlement`).
pub(super) async fn check<R: Reserve>(
    limiter: &RateLimiter,
    limits: &LimitSet,
    request: LimitRequest<'_, R>,
    plan: Option<usize>,
    trail: Option<&Trail>,
) -> Result<(Checked, Option<Instant>), Refusal> {
    let (facts, reserve) = (request.facts, request.reserve);
    let settles_tokens = reserve.reserves() && limits.counts_tokens();
    let asked = (limits.counts_statuses() || settles_tokens).then(Instant::now);
    let traced = trail.filter(|trail| trail.span().is_some());
    let start = traced.map(|_| (SystemTime::now(), Instant::now()));
    let checked = limits.check(limiter, request).await.map_err(not_checked)?;
    if let (Some(trail), Some((start, began))) = (traced, start) {
        trail.note_limiter_call(|| LimiterCall {
            start,
            took: began.elapsed(),
            store: limiter.backend().name(),
            fallback: checked.decided_by == DecidedBy::Fallback,
            keys: checked.outcome.decisions.len(),
            batch: checked.outcome.batch,
        });
    }
    if checked.outcome.allowed {
        return Ok((checked, asked));
    }
    let waiting = wait_if_queued(limiter, limits, facts, reserve, checked)
        .map_err(|checked| Refusal::RateLimited { checked, plan })?;
    match waiting.await {
        // What is settled after the answer lands where the last ask did.
        Waited::Admitted(checked, at) => Ok((checked, asked.map(|_| at))),
        Waited::Refused(checked) => Err(Refusal::RateLimited { checked, plan }),
        Waited::Failed(error) => Err(not_checked(error)),
    }
}

/// Checks limits their caller keyed itself (Envoy's descriptors, see `rls/`), each at what the request takes from
/// it, in the limiter call a route's limits make (`Checked::answered`): all or nothing, the store's decision of each
/// in order. Refused as a route's request is: [`Refusal::RateLimited`] when a limit refuses (its `checked` says
/// which), [`Refusal::Unavailable`] when the store failed and `on_error` refuses; where `on_error` admits, a failed
/// store admits with no decision.
pub async fn check_keyed(
    limiter: &RateLimiter,
    checks: &[LimitCheck<'_>],
) -> Result<Checked, Refusal> {
    let applied = (0..checks.len()).collect();
    let answer = limiter
        .check_leased(checks, 0)
        .await
        .map_err(|error| not_checked(error.into()))?;
    let checked = Checked::answered(answer, applied, 0);
    if checked.outcome.allowed {
        Ok(checked)
    } else {
        Err(Refusal::RateLimited {
            checked,
            plan: None,
        })
    }
}

/// The wait for a slot of a request `checked` refused, when only slots it may wait for are wanting (boxed: only a
/// request that waits pays for its future); else the refusal as it stands. Only a route with a concurrency limit
/// looks.
#[allow(clippy::type_complexity)]
fn wait_if_queued<'a, R: Reserve + 'a>(
    limiter: &'a RateLimiter,
    limits: &'a LimitSet,
    facts: &'a RequestFacts<'a>,
    reserve: R,
    checked: Checked,
) -> Result<Pin<Box<dyn Future<Output = Waited> + Send + 'a>>, Checked> {
    let refusal = match limits.holds_slots() {
        true => limits.queued_refusal(&checked),
        false => None,
    };
    match refusal {
        Some(refusal) => Ok(Box::pin(wait_for_slot(
            limiter, limits, facts, reserve, checked, refusal,
        ))),
        None => Err(checked),
    }
}

/// The refusal of a request the limiter did not decide.
fn not_checked(error: NotChecked) -> Refusal {
    match error {
        NotChecked::Ambiguous(_) => Refusal::AmbiguousKey,
        NotChecked::Unavailable(error) => Refusal::Unavailable(error),
        NotChecked::TooLarge {
            limit,
            reserved,
            capacity,
        } => Refusal::ReservationTooLarge {
            limit,
            reserved,
            capacity,
        },
    }
}
