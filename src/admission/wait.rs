//! Wait: a request held by a `leaky_bucket` in delay mode; if it never leaves the hold (its client went away, the
//! connection closed), what it took is given back, as nginx's `limit_req` queue moves on without it.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use super::limits::{Checked, LimitSet};
use crate::key::RequestFacts;
use crate::limiter::RateLimiter;

/// Holds an admitted request for the `delay_ms` a `leaky_bucket` in delay mode asks (the caller awaits this only
/// when it asks some: a future polled for nothing costs every request).
pub(super) async fn hold_for_delay(
    limiter: &RateLimiter,
    limits: &LimitSet,
    facts: &RequestFacts<'_>,
    checked: &Checked,
    delay_ms: u64,
) {
    // Held, as nginx's limit_req holds: a client that leaves meanwhile gives its place back, so the queue moves on
    // without it.
    let taken = limits.taken(facts, checked);
    let held = Held::new(limiter.give_back(taken, checked.decided_by, Instant::now()));
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    held.forwarded();
}

/// Gives back a held request's place when dropped, unless [`forwarded`](Self::forwarded) said it left the hold.
struct Held {
    give_back: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

// === impl Held ===

impl Held {
    /// Holds `give_back` (what returns the place), to be run if the request is dropped while held. Boxed: only
    /// held requests pay for it.
    fn new(give_back: impl Future<Output = ()> + Send + 'static) -> Self {
        Self {
            give_back: Some(Box::pin(give_back)),
        }
    }

    /// The request left the hold to be forwarded: its place stays taken.
    fn forwarded(mut self) {
        self.give_back = None;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(give_back) = self.give_back.take() else {
            return;
        };
        // Dropped with its request's task: the give-back runs on a task of its own (and not at all if the runtime
        // itself is going away).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(give_back);
        }
    }
}
