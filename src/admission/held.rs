//! A request held by a `leaky_bucket` in delay mode: if it never leaves the hold (its client went away, the
//! connection closed), what it took is given back, as nginx's `limit_req` queue moves on without it.

use std::future::Future;
use std::pin::Pin;

/// Gives back a held request's place when dropped, unless [`forwarded`](Self::forwarded) said it left the hold.
pub(super) struct Held {
    give_back: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

// === impl Held ===

impl Held {
    /// Holds `give_back` (what returns the place), to be run if the request is dropped while held. Boxed: only
    /// held requests pay for it.
    pub(super) fn new(give_back: impl Future<Output = ()> + Send + 'static) -> Self {
        Self {
            give_back: Some(Box::pin(give_back)),
        }
    }

    /// The request left the hold to be forwarded: its place stays taken.
    pub(super) fn forwarded(mut self) {
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
