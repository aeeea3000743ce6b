//! The slots of `concurrency` limits an admitted request holds, released once its answer ends: its last byte sent,
//! the client gone, the upstream failed, a stream or a WebSocket tunnel closed.

use std::sync::Arc;

use super::after_answer::{AfterAnswer, Ending};
use crate::limiter::{Giver, Limit, SlotQueues};

/// The slots one admitted request holds, with the `tollgate_in_flight` gauge of each limit.
pub(super) struct HeldSlots {
    giver: Giver,
    /// Per `concurrency` limit that admitted the request: its store key, the limit, its gauge.
    held: Vec<(String, Limit, metrics::Gauge)>,
    /// What the slots are held under in Redis.
    lease: u64,
    /// The lines of waiting requests, which know the running config's `max` (see [`HeldSlots::ended`]).
    queues: Arc<SlotQueues>,
}

// === impl HeldSlots ===

impl HeldSlots {
    /// Slots taken by an admitted request, counted in flight from now until its answer ends.
    pub(super) fn new(
        giver: Giver,
        held: Vec<(String, Limit, metrics::Gauge)>,
        lease: u64,
        queues: Arc<SlotQueues>,
    ) -> Self {
        for (_, _, gauge) in &held {
            gauge.increment(1.0);
        }
        let renewed: Vec<(String, Limit)> = held
            .iter()
            .map(|(key, limit, _)| (key.clone(), limit.clone()))
            .collect();
        giver.hold_slots(&renewed, lease);
        Self {
            giver,
            held,
            lease,
            queues,
        }
    }
}

impl AfterAnswer for HeldSlots {
    fn ended(self: Box<Self>, _: Ending) {
        // However the answer ended, the request is no longer in flight.
        let this = *self;
        let held = this
            .held
            .into_iter()
            .map(|(key, limit, gauge)| {
                gauge.decrement(1.0);
                // A reload that lowered `max` since the request came: the release is of a key full at the new
                // `max`, and announced as such to the requests waiting for it (they wait for the new one).
                let running = key
                    .rfind('{')
                    .and_then(|brace| this.queues.running_max(&key[..=brace]));
                match running {
                    Some(max) if max < limit.algorithm().capacity() => {
                        let limit = limit.with_max(max);
                        (key, limit)
                    }
                    _ => (key, limit),
                }
            })
            .collect();
        this.giver.release_slots(held, this.lease);
    }
}

/// Two pieces of work kept for after one answer (a limit counting answers by status beside a concurrency limit),
/// told everything in turn.
pub(super) struct Both(pub Box<dyn AfterAnswer>, pub Box<dyn AfterAnswer>);

impl AfterAnswer for Both {
    fn status(&mut self, status: http::StatusCode) {
        self.0.status(status);
        self.1.status(status);
    }

    #[cfg(feature = "llm")]
    fn usage(&mut self, handed: crate::usage::Handed) {
        // The token settlement, when there is one, is the first: slots read no usage.
        self.0.usage(handed);
    }

    fn ended(self: Box<Self>, ending: Ending) {
        let Both(first, second) = *self;
        first.ended(ending);
        second.ended(ending);
    }
}
